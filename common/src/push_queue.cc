#include "loaderx/push_queue.h"

#include <fcntl.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <string>

#include "loaderx/memfd.h"

namespace loaderx {

const int kPushQueueSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

namespace {

constexpr uint64_t kDataBytesAt = 8;
constexpr uint64_t kTailAt = 64;
constexpr uint64_t kHeadAt = 128;

constexpr uint64_t Padded(uint64_t n) { return (n + 7) / 8 * 8; }

std::atomic_ref<uint64_t> Word(uint8_t* base, uint64_t at) {
  return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(base + at));
}

// Copies n bytes at position `pos` of the data area (wrapping) to `out`.
void CopyOut(const uint8_t* data, uint64_t data_bytes, uint64_t pos, uint8_t* out, uint64_t n) {
  const uint64_t at = pos & (data_bytes - 1);
  const uint64_t first = std::min(n, data_bytes - at);
  std::memcpy(out, data + at, first);
  std::memcpy(out + first, data, n - first);
}

void CopyIn(uint8_t* data, uint64_t data_bytes, uint64_t pos, const uint8_t* in, uint64_t n) {
  const uint64_t at = pos & (data_bytes - 1);
  const uint64_t first = std::min(n, data_bytes - at);
  std::memcpy(data + at, in, first);
  std::memcpy(data, in + first, n - first);
}

}  // namespace

Result<PushQueueWriter> PushQueueWriter::Create(uint64_t data_bytes) {
  if (data_bytes < kPushQueueMinBytes || data_bytes > kPushQueueMaxBytes ||
      !std::has_single_bit(data_bytes)) {
    return Status::InvalidArgument("push queue data area of " + std::to_string(data_bytes) +
                                   " bytes (a power of two in 4096.." +
                                   std::to_string(kPushQueueMaxBytes) + ")");
  }
  PushQueueWriter q;
  q.data_bytes_ = data_bytes;
  LX_ASSIGN_OR_RETURN(q.fd_, CreateMemfd("loaderx-push-queue", q.total_bytes()));
  LX_ASSIGN_OR_RETURN(q.map_,
                      MappedRegion::Map(q.fd_.get(), q.total_bytes(), 0, /*writable=*/true));
  uint8_t* base = q.map_.mutable_data();
  std::memcpy(base, &kPushQueueMagic, 8);
  std::memcpy(base + kDataBytesAt, &data_bytes, 8);
  LX_RETURN_IF_ERROR(SealMemfd(q.fd_.get(), kPushQueueSeals));
  return q;
}

Result<uint64_t> PushQueueWriter::Head() {
  const uint64_t h = Word(map_.mutable_data(), kHeadAt).load(std::memory_order_acquire);
  if (h < head_ || h > tail_) {
    return Status::Protocol("push queue: the client's head is at " + std::to_string(h) +
                            " bytes, which is not between its last head " + std::to_string(head_) +
                            " and the tail " + std::to_string(tail_));
  }
  head_ = h;
  return h;
}

Result<uint64_t> PushQueueWriter::Unread() {
  LX_ASSIGN_OR_RETURN(uint64_t h, Head());
  return tail_ - h;
}

Result<bool> PushQueueWriter::Write(std::span<const uint8_t> frame) {
  const uint64_t need = kPushQueueEntryHeader + Padded(frame.size());
  if (need > data_bytes_) {
    return Status::Internal("a " + std::to_string(frame.size()) +
                            "-byte frame cannot fit a push queue of " +
                            std::to_string(data_bytes_) + " bytes");
  }
  LX_ASSIGN_OR_RETURN(uint64_t h, Head());
  if (tail_ - h + need > data_bytes_) return false;
  uint8_t* data = map_.mutable_data() + kPushQueueHeaderBytes;
  const uint32_t header[2] = {static_cast<uint32_t>(frame.size()), 0};
  CopyIn(data, data_bytes_, tail_, reinterpret_cast<const uint8_t*>(header), sizeof header);
  CopyIn(data, data_bytes_, tail_ + kPushQueueEntryHeader, frame.data(), frame.size());
  tail_ += need;
  Word(map_.mutable_data(), kTailAt).store(tail_, std::memory_order_release);
  return true;
}

Result<PushQueueReader> PushQueueReader::Attach(UniqueFd fd, uint64_t total_bytes) {
  LX_RETURN_IF_ERROR(CheckSealedMemfd(fd.get(), kPushQueueSeals, total_bytes)
                         .WithContext("push queue from loaderxd"));
  if (total_bytes < kPushQueueHeaderBytes + kPushQueueMinBytes ||
      total_bytes > kPushQueueHeaderBytes + kPushQueueMaxBytes) {
    return Status::Protocol("push queue of " + std::to_string(total_bytes) + " bytes");
  }
  PushQueueReader q;
  LX_ASSIGN_OR_RETURN(q.map_, MappedRegion::Map(fd.get(), total_bytes, 0, /*writable=*/true));
  uint64_t magic = 0, data_bytes = 0;
  std::memcpy(&magic, q.map_.data(), 8);
  std::memcpy(&data_bytes, q.map_.data() + kDataBytesAt, 8);
  if (magic != kPushQueueMagic || data_bytes != total_bytes - kPushQueueHeaderBytes ||
      !std::has_single_bit(data_bytes)) {
    return Status::Protocol("push queue header: magic " + std::to_string(magic) + ", " +
                            std::to_string(data_bytes) + " data bytes in a memfd of " +
                            std::to_string(total_bytes));
  }
  q.data_bytes_ = data_bytes;
  q.head_ = Word(q.map_.mutable_data(), kHeadAt).load(std::memory_order_relaxed);
  if (q.head_ != 0) return Status::Protocol("a new push queue's head is not 0");
  q.fd_ = std::move(fd);
  return q;
}

Result<bool> PushQueueReader::Peek(std::vector<uint8_t>* frame) {
  peeked_ = 0;
  uint8_t* base = map_.mutable_data();
  const uint64_t tail = Word(base, kTailAt).load(std::memory_order_acquire);
  if (tail == head_) return false;
  const uint64_t avail = tail - head_;
  if (tail < head_ || avail > data_bytes_ || avail < kPushQueueEntryHeader) {
    return Status::Protocol("push queue: tail " + std::to_string(tail) + " against head " +
                            std::to_string(head_) + " in " + std::to_string(data_bytes_) +
                            " bytes");
  }
  const uint8_t* data = base + kPushQueueHeaderBytes;
  uint32_t header[2];
  CopyOut(data, data_bytes_, head_, reinterpret_cast<uint8_t*>(header), sizeof header);
  const uint64_t need = kPushQueueEntryHeader + Padded(header[0]);
  if (header[0] == 0 || header[1] != 0 || need > avail) {
    return Status::Protocol("push queue: an entry of " + std::to_string(header[0]) +
                            " bytes (pad word " + std::to_string(header[1]) + ") with " +
                            std::to_string(avail) + " bytes written");
  }
  frame->resize(header[0]);
  CopyOut(data, data_bytes_, head_ + kPushQueueEntryHeader, frame->data(), header[0]);
  peeked_ = need;
  return true;
}

void PushQueueReader::Pop() {
  if (peeked_ == 0) return;
  head_ += peeked_;
  peeked_ = 0;
  Word(map_.mutable_data(), kHeadAt).store(head_, std::memory_order_release);
}

}  // namespace loaderx
