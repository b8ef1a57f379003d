// The push queue (protocol 1.4, docs/protocol.md "Push queue"): a
// single-producer single-consumer byte ring in a memfd of its own, one per
// loader session, through which loaderxd hands its client the `batch`
// frames it would otherwise send on the socket. The client reads its next
// batch with a load instead of a `recvmsg`; the socket still carries every
// other frame, and a `heartbeat` wakes a client that said it waits.
//
// Layout (little-endian, all offsets from the start of the memfd):
//   0     u64 magic kPushQueueMagic
//   8     u64 data_bytes: the data area's size (a power of two >= 4096)
//   64    u64 tail: bytes the daemon has written (monotonic), stored with
//         release order after the entry's bytes
//   128   u64 head: bytes the client has read (monotonic), stored by the
//         client with release order once it is done with an entry
//   4096  the data area: entries at positions modulo data_bytes
// An entry is a u32 frame length, a u32 0, then the frame's bytes (which
// may wrap around the end of the data area), padded to 8 bytes.
//
// Trust: the daemon maps the memfd read-write and the client too (it
// writes `head`); the daemon reads only `head`, from its own mapping, and
// checks it (never behind what it read before, never ahead of its tail)
// before using it for free space: a client that writes anything else there
// is a protocol violation. It never reads the header or the data back: its
// tail and sizes are its own copies. The client checks everything it reads
// (the header at attach; every entry's length against the bytes the tail
// says are there) before use. The memfd is sealed against resizing, so no
// mapping of it can fault past its end.
//
// Thread-safety: one writer thread (or callers serialised by the daemon's
// session lock) and one reader thread per queue.
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <vector>

#include "loaderx/fd.h"
#include "loaderx/status.h"

namespace loaderx {

inline constexpr uint64_t kPushQueueMagic = 0x315148535550584cULL;  // "LXPUSHQ1"
inline constexpr uint64_t kPushQueueHeaderBytes = 4096;
inline constexpr uint64_t kPushQueueMinBytes = 4096;
inline constexpr uint64_t kPushQueueMaxBytes = uint64_t{1} << 20;
inline constexpr uint64_t kPushQueueEntryHeader = 8;
// F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL (no write seal: the client
// stores its head).
extern const int kPushQueueSeals;

// The data area loaderxd gives every queue: pushed items wait in it only
// up to the push window (one item ahead of the caller's take, plus a take
// not reported yet and the items of a generation a seek left), so a few
// frames are ever in it; the largest frame is an error's (kMaxWireString).
inline constexpr uint64_t kPushQueueDataBytes = uint64_t{64} << 10;

// The daemon's side.
class PushQueueWriter {
 public:
  // A sealed memfd with a data area of `data_bytes` (PushQueueDataBytes).
  static Result<PushQueueWriter> Create(uint64_t data_bytes);
  PushQueueWriter() = default;
  PushQueueWriter(PushQueueWriter&&) = default;
  PushQueueWriter& operator=(PushQueueWriter&&) = default;

  int fd() const { return fd_.get(); }
  uint64_t total_bytes() const { return kPushQueueHeaderBytes + data_bytes_; }
  // Appends one frame. False if it does not fit beside what the client has
  // not read yet (nothing written); Protocol if the client's head is not a
  // position this queue was at. REQUIRES: frame.size() <= data_bytes - 8.
  Result<bool> Write(std::span<const uint8_t> frame);
  // Bytes written that the client has not read (Protocol as for Write).
  Result<uint64_t> Unread();

 private:
  Result<uint64_t> Head();
  UniqueFd fd_;
  MappedRegion map_;
  uint64_t data_bytes_ = 0;
  uint64_t tail_ = 0;  // the daemon's own copy
  uint64_t head_ = 0;  // the client's head, as last read
};

// The client's side.
class PushQueueReader {
 public:
  PushQueueReader() = default;
  // Checks the memfd's seals and size and the header it was made with.
  static Result<PushQueueReader> Attach(UniqueFd fd, uint64_t total_bytes);
  bool attached() const { return data_bytes_ != 0; }
  // The next entry's frame, copied into *frame, without consuming it: false
  // if the queue is empty; Protocol if the daemon wrote a malformed entry.
  Result<bool> Peek(std::vector<uint8_t>* frame);
  // Consumes the entry Peek returned (its space goes back to the daemon).
  void Pop();

 private:
  UniqueFd fd_;
  MappedRegion map_;
  uint64_t data_bytes_ = 0;
  uint64_t head_ = 0;
  uint64_t peeked_ = 0;  // bytes of the entry Peek returned, 0 if none
};

}  // namespace loaderx
