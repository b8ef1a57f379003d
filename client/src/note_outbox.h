// NoteOutbox: the notes a client sends without waiting for a reply
// (`release` of a slot, `consumed` positions) on its session's socket.
//
// A note goes out at once when the socket has room, never blocking (notes
// are sent from destructors, in Python with the GIL held). When the socket
// is full (a stopped or slow daemon) the note is queued, in order, and the
// queue is sent by the receiver as soon as the socket has room (the daemon
// pushes nothing more until it has read them) or before the next request.
// One take may be *deferred* (docs/protocol.md "Consumed positions"): kept
// until the next frame this client sends, so that a take and the release of
// the batch held before it go out in one sendmmsg.
//
// Thread-safety: every method may be called from any thread (one mutex).
// The socket is the session's; the outbox does not own it.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>

#include "loaderx/wire.h"

namespace loaderx::client {

class NoteOutbox {
 public:
  explicit NoteOutbox(int fd) : fd_(fd) {}
  NoteOutbox(const NoteOutbox&) = delete;
  NoteOutbox& operator=(const NoteOutbox&) = delete;

  // Sends `note` (after the deferred take, if any, in the same sendmmsg)
  // without blocking, or queues it behind the notes already queued. A
  // socket error other than "full" drops it: the daemon is gone, and so are
  // the slots.
  void Send(const Message& note);
  // Defers `take` until the next frame sent; it supersedes an older deferred
  // take (positions only move on). Behind queued notes it is queued instead.
  void Defer(const ConsumedMsg& take);
  // Queues the deferred take, if any, behind the queued notes (whatever
  // flushes the queue next sends it).
  void QueueDeferred();
  // A wait for position (gen, step) begins. If the deferred take is that
  // very position, the daemon could not push since: it is dropped (the
  // wait's own note reports it) and true is returned (a *miss*); otherwise
  // it is queued as QueueDeferred does, and false is returned.
  bool DropIfDeferred(uint64_t gen, uint64_t step);
  // Whether notes are queued. Seq_cst, no lock: a stale read only delays a
  // flush to the receiver's next poll.
  bool queued() const { return queued_.load(std::memory_order_seq_cst); }
  // Sends as many queued notes as go without blocking, in order: true if
  // none is left.
  bool TrySendQueued();
  // Hands over every queued note, the deferred take last, for a blocking
  // send before a request; the outbox is empty afterwards.
  std::deque<Message> TakeAll();
  // Sends every queued note, the deferred take, then `last`, each without
  // blocking; stops at the first that does not go (the rest is dropped:
  // the session then lingers until its hang-up, late, never unsafe).
  void SendAllThen(const Message& last);

 private:
  void QueueDeferredLocked();  // REQUIRES mu_
  bool TrySendQueuedLocked();  // REQUIRES mu_

  const int fd_;
  std::mutex mu_;
  // Notes that found the socket full, oldest first. Guarded by mu_.
  std::deque<Message> pending_;
  // The deferred take; only set while pending_ is empty (behind queued
  // notes a take is queued too). Guarded by mu_.
  std::optional<ConsumedMsg> deferred_;
  // !pending_.empty(), readable without the lock. Written under mu_.
  std::atomic<bool> queued_{false};
};

}  // namespace loaderx::client
