#include "note_outbox.h"

#include <array>
#include <span>
#include <vector>

#include "loaderx/unix_socket.h"

namespace loaderx::client {

void NoteOutbox::Send(const Message& note) {
  std::lock_guard<std::mutex> lock(mu_);
  if (pending_.empty() && deferred_) {
    // The deferred take first, then this note: one sendmmsg.
    const std::vector<uint8_t> take = EncodeMessage(*deferred_);
    const std::vector<uint8_t> frame = EncodeMessage(note);
    const std::array<std::span<const uint8_t>, 2> frames{take, frame};
    Result<size_t> sent = SendFrames(fd_, frames, /*nonblocking=*/true);
    if (!sent.ok() && sent.status().code() != Status::Code::kResourceExhausted) {
      deferred_.reset();  // the daemon is gone, and so are the slots
      return;
    }
    const size_t went = sent.ok() ? *sent : 0;
    if (went == 0) pending_.push_back(*deferred_);
    deferred_.reset();
    if (went == 2) return;
  } else if (pending_.empty()) {
    Status st = SendFrame(fd_, EncodeMessage(note), {}, /*nonblocking=*/true);
    if (st.code() != Status::Code::kResourceExhausted) return;
  }
  pending_.push_back(note);
  queued_.store(true, std::memory_order_seq_cst);
}

void NoteOutbox::Defer(const ConsumedMsg& take) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!pending_.empty()) {  // behind a full socket: in order, with the rest
    pending_.push_back(take);
    queued_.store(true, std::memory_order_seq_cst);
    return;
  }
  deferred_ = take;
}

void NoteOutbox::QueueDeferredLocked() {
  if (!deferred_) return;
  pending_.push_back(*deferred_);
  deferred_.reset();
  queued_.store(true, std::memory_order_seq_cst);
}

void NoteOutbox::QueueDeferred() {
  std::lock_guard<std::mutex> lock(mu_);
  QueueDeferredLocked();
}

bool NoteOutbox::DropIfDeferred(uint64_t gen, uint64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  if (deferred_ && deferred_->gen == gen && deferred_->step == step) {
    deferred_.reset();
    return true;
  }
  QueueDeferredLocked();
  return false;
}

bool NoteOutbox::TrySendQueuedLocked() {
  while (!pending_.empty()) {
    Status st = SendFrame(fd_, EncodeMessage(pending_.front()), {}, /*nonblocking=*/true);
    if (st.code() == Status::Code::kResourceExhausted) return false;  // still full
    // Sent, or the daemon is gone (then so are the slots): either way done.
    pending_.pop_front();
  }
  queued_.store(false, std::memory_order_seq_cst);
  return true;
}

bool NoteOutbox::TrySendQueued() {
  std::lock_guard<std::mutex> lock(mu_);
  return TrySendQueuedLocked();
}

std::deque<Message> NoteOutbox::TakeAll() {
  std::deque<Message> out;
  std::lock_guard<std::mutex> lock(mu_);
  QueueDeferredLocked();
  out.swap(pending_);
  queued_.store(false, std::memory_order_seq_cst);
  return out;
}

void NoteOutbox::SendAllThen(const Message& last) {
  std::lock_guard<std::mutex> lock(mu_);
  QueueDeferredLocked();
  while (!pending_.empty()) {
    if (!SendFrame(fd_, EncodeMessage(pending_.front()), {}, /*nonblocking=*/true).ok()) return;
    pending_.pop_front();
  }
  queued_.store(false, std::memory_order_seq_cst);
  (void)SendFrame(fd_, EncodeMessage(last), {}, /*nonblocking=*/true);
}

}  // namespace loaderx::client
