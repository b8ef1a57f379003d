// The loaderxd wire protocol: typed messages <-> frames.
//
// Every frame on the SOCK_SEQPACKET socket is one message in one of two
// encodings, told apart by its first byte (one encoding per message type):
//  * the three per-batch messages -- `batch` (daemon -> client), `release`
//    and `consumed` (client -> daemon) -- are fixed-width little-endian
//    binary frames: kBinaryFrameMark (0xc1, the one byte msgpack never
//    uses, so no msgpack frame starts with it), a BinaryType byte, then the
//    fields at fixed offsets; `batch` ends with its stream count and one
//    fixed record per stream (docs/protocol.md "Encoding" draws the bytes).
//    These are decoded on every batch hand-off, so they must cost a few
//    loads, not a msgpack parse (protocol 1.3);
//  * every other message is exactly one msgpack map whose "t" key names the
//    message type; the other keys are that type's fields (docs/protocol.md
//    lists them).
// Both sides speak protocol kProtocolMajor; the hello exchange refuses a
// different major with a message naming both versions, and a peer may rely on
// features of a minor only after the other side announced at least that
// minor.
//
// Decoding is strict, because the daemon faces untrusted local processes.
// Binary frames: a known type byte, exactly the length of that type (for
// `batch`, of its stream count, at most kMaxWireStreams), every one-byte
// flag or kind 0 or 1. Msgpack frames: sizes are capped before anything is
// allocated, the frame must be one map with no trailing bytes, every key
// must be known for its type, every required key present, every value of
// the right type and in range; a map whose "t" is one of the binary types is
// refused. Anything else is Status::Protocol naming the problem; the daemon
// then drops that one connection.
//
// Fds travel beside the bytes (unix_socket.h); messages only say how many
// to expect (OpenMsg) and the receiver checks the count (none on anything
// but open/opened, so none on a binary frame).
//
// Thread-safety: pure functions over values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "loaderx/group.h"
#include "loaderx/status.h"

namespace loaderx {

inline constexpr uint32_t kProtocolMajor = 1;
// 1.1 added groups: optional `group`/`group_mode`/`join` on open and
// `step` on opened (sent only to a client that asked for a group).
// 1.2 pushes batches: `open` grants a credit (the lease cap) and the daemon
// pushes ready batches while the client holds fewer; `seek` starts a new
// generation that every pushed batch carries; every request carries an `id`
// its reply echoes; `next` is gone and `close` has no reply. Liveness: an
// unsolicited `heartbeat` every heartbeat_ms while the client may be
// waiting. A 1.1 client is refused at hello (docs/protocol.md).
// 1.3 encodes the per-batch messages (`batch`, `release`, `consumed`) as
// fixed binary frames instead of msgpack maps (same fields); a 1.2 peer is
// refused at hello either way.
// 1.4 adds the push queue (loaderx/push_queue.h): an `open` with
// `push_queue` gets `queue_bytes` and a second fd in its `opened`, and the
// daemon writes that loader's `batch` frames into the queue instead of
// the socket. A 1.3 client (which never asks) is served as before.
// 1.5 adds shard groups over part of the data-parallel ranks (the local
// ranks of one node of a multi-node job) and several members per rank
// (model-parallel replicas): optional `open` keys `ranks_first`,
// `ranks_count` and `replicas`, sent only to a daemon that announced 1.5.
// 1.6 adds mixture schedules (loaderx/mix.h, "Schedules"): optional `open`
// keys `mix_datasets` (K, with S * K `mix_counts`) and `segments` (the
// sampler segments, loaderx/sampler.h), sent only to a daemon that
// announced 1.6.
inline constexpr uint32_t kProtocolMinor = 6;
// The oldest minor this build serves (and, as a client, accepts).
inline constexpr uint32_t kMinProtocolMinor = 3;
// How often the daemon's io loop sends `heartbeat` to a waiting client.
inline constexpr uint32_t kHeartbeatIntervalMs = 250;
// Decoder caps (also bound what a hostile peer can make us allocate).
inline constexpr uint32_t kMaxWireStreams = 64;
inline constexpr uint32_t kMaxWireDims = 32;
// Segments of one mixture schedule on the wire, at most.
inline constexpr uint32_t kMaxWireSegments = 1024;
// Members per rank of a shard group (model-parallel replicas), at most.
inline constexpr uint32_t kMaxReplicas = 1024;
inline constexpr uint32_t kMaxWireString = 4096;
inline constexpr uint32_t kMaxWireDataFiles = 255;
// Groups (GroupMode, GroupJoin, kMaxGroupName): loaderx/group.h.

// Protocol 1.3: the first byte of every binary frame. 0xc1 is the one byte
// the msgpack spec never uses, so a msgpack frame can never start with it.
inline constexpr uint8_t kBinaryFrameMark = 0xc1;
// The second byte of a binary frame: which message it is.
enum class BinaryType : uint8_t { kBatch = 1, kRelease = 2, kConsumed = 3 };
// Frame sizes in bytes (docs/protocol.md "Encoding"): mark, type, fields.
inline constexpr size_t kBatchFrameHeaderBytes = 55;  // up to and with the stream count
inline constexpr size_t kBatchFrameStreamBytes = 33;  // one StreamLayoutMsg
inline constexpr size_t kReleaseFrameBytes = 14;
inline constexpr size_t kConsumedFrameBytes = 19;
inline constexpr size_t BatchFrameBytes(size_t streams) {
  return kBatchFrameHeaderBytes + streams * kBatchFrameStreamBytes;
}

// client -> daemon, first message on every connection.
struct HelloMsg {
  uint32_t major = kProtocolMajor;
  uint32_t minor = kProtocolMinor;
  std::string client_version;
  bool operator==(const HelloMsg&) const = default;
};
// daemon -> client reply to hello.
struct HelloOkMsg {
  uint32_t major = kProtocolMajor;
  uint32_t minor = kProtocolMinor;
  std::string daemon_version;
  uint64_t incarnation = 0;  // random per daemon start
  uint64_t session = 0;      // id of this connection in the daemon's logs/stats
  // 1.2, sent only to a client that said minor >= 2 (optional key; 0 when
  // absent: no heartbeats, so no liveness check).
  uint32_t heartbeat_ms = 0;
  bool operator==(const HelloOkMsg&) const = default;
};
// daemon -> client, unsolicited (1.2): "still alive". Answers nothing; the
// client skips it. Sent only while the client may be waiting (a request
// outstanding, or a batch owed under its credit) and everything sent before
// it has been read, so at most one heartbeat is ever unread.
struct HeartbeatMsg {
  bool operator==(const HeartbeatMsg&) const = default;
};

// What one entry of OpenMsg::streams stands for (protocol 1.2, optional key
// "mix"; absent: kStore). A mixture (loaderx/mix.h) with K = mix_counts
// datasets is sent as K consecutive kMixPart entries per mixed stream (its
// part of dataset 0, 1, ..., K-1) and at most one kMixSource entry (the
// dataset-number stream, no files). The loader's streams are the entries in
// order with each run of K parts counted once.
enum class StreamRole : uint32_t { kStore = 0, kMixPart = 1, kMixSource = 2 };

// How many fds one stream contributes to an OpenMsg, in this order:
// meta, index, [shapes], [dict], data[0..data_files). A kMixSource entry
// contributes none (no label, no files).
struct StreamFilesMsg {
  std::string label;
  bool has_shapes = false;
  bool has_dict = false;
  uint32_t data_files = 0;
  StreamRole role = StreamRole::kStore;
  uint32_t FdCount() const {
    return role == StreamRole::kMixSource ? 0 : 2 + has_shapes + has_dict + data_files;
  }
  bool operator==(const StreamFilesMsg&) const = default;
};
// client -> daemon: open a loader over the passed store fds. Once it is
// answered the daemon pushes batches (generation 0) while the client holds
// fewer than the granted `leases` (its credit).
struct OpenMsg {
  uint64_t id = 0;  // echoed by the reply (opened or error)
  std::vector<StreamFilesMsg> streams;
  uint64_t batch_size = 0;
  uint32_t mode = 1;  // SamplerMode
  uint64_t seed = 42;
  uint64_t rank = 0;
  uint64_t world_size = 1;
  uint64_t start_step = 0;
  uint32_t prefetch = 4;
  uint32_t leases = 8;      // batches the client may hold at once
  uint64_t ring_bytes = 0;  // 0: the daemon sizes the ring
  // Protocol 1.1, optional: a non-empty `group` joins (or creates) that
  // group of the caller's uid. `group_mode`/`join` are only sent with a
  // group; a frame carrying them without one is malformed.
  std::string group;
  GroupMode group_mode = GroupMode::kShard;
  GroupJoin join = GroupJoin::kDefault;
  // Protocol 1.2, optional, only with a group: how long (ms) this member's
  // `next` may wait for its group's other members before the daemon answers
  // it with a Timeout error naming them; 0 (not sent): loaderxd's
  // --group-timeout.
  uint64_t group_timeout_ms = 0;
  // Protocol 1.2, optional: the positions each dataset of a mixture owns
  // (loaderx/mix.h); non-empty exactly when some stream is a kMixPart or
  // kMixSource entry.
  std::vector<uint64_t> mix_counts;
  // Protocol 1.4, optional (sent only when true): deliver this loader's
  // batches through a push queue (docs/protocol.md "Push queue").
  bool push_queue = false;
  // Protocol 1.5, optional, only with a shard group: the group serves the
  // data-parallel ranks [ranks_first, ranks_first + ranks_count) of
  // world_size (ranks_count 0, not sent: all of them), each rank to
  // `replicas` members that receive the same batches (1, not sent: one).
  uint64_t ranks_first = 0;
  uint64_t ranks_count = 0;
  uint32_t replicas = 1;
  // Protocol 1.6, optional: a mixture schedule. `mix_datasets` is K (0, not
  // sent: mix_counts.size(), one segment); then mix_counts holds S * K
  // counts, segment-major, and the runs of mix parts are K long. `segments`
  // is the sampler's (start_step, base, size) per segment, flat (empty, not
  // sent: none); only with `mix_datasets`.
  uint64_t mix_datasets = 0;
  std::vector<uint64_t> segments;
  uint32_t TotalFds() const;
  bool operator==(const OpenMsg&) const = default;
};
struct StreamSchemaMsg {
  uint32_t kind = 0;  // Kind
  std::string dtype;  // NumPy dtype.str
  std::vector<uint64_t> item_shape;
  uint32_t ndim = 0;
  uint64_t size = 0;  // records
  bool operator==(const StreamSchemaMsg&) const = default;
};
// daemon -> client reply to open; carries the ring memfd as its one fd.
struct OpenedMsg {
  uint64_t id = 0;  // the open's id
  uint64_t n = 0;   // records per stream (the sampler's n)
  uint32_t slot_count = 0;
  uint64_t ring_bytes = 0;
  uint32_t leases = 0;  // the granted lease cap (<= requested): the credit
  std::vector<StreamSchemaMsg> streams;
  // Protocol 1.1, only in reply to a group open: the step this member's
  // first `next` returns (join="current" starts where the group is).
  std::optional<uint64_t> step;
  // Protocol 1.4, only in reply to an open with `push_queue`: the queue
  // memfd's size, the reply's second fd. 0: not sent (no queue).
  uint64_t queue_bytes = 0;
  bool operator==(const OpenedMsg&) const = default;
};
struct StreamLayoutMsg {
  uint32_t kind = 0;  // Kind: 0 dense, 1 ragged (one byte on the wire)
  uint64_t values_offset = 0;
  uint64_t values_bytes = 0;
  uint64_t shapes_offset = 0;
  uint64_t offsets_offset = 0;
  bool operator==(const StreamLayoutMsg&) const = default;
};
// daemon -> client, pushed (never a reply): the batch of `step` is in ring
// slot `slot`; one lease, released with ReleaseMsg. `gen` is the generation
// it was produced for: a batch of an older generation than the client's
// (pushed before a seek the daemon accepted) is released unread.
// A binary frame (1.3): BatchFrameBytes(streams.size()) bytes.
struct BatchMsg {
  uint64_t gen = 0;
  uint64_t step = 0;
  uint32_t slot = 0;
  uint64_t seq = 0;
  uint64_t offset = 0;  // from the ring start
  uint64_t batch_size = 0;
  uint64_t total_bytes = 0;
  std::vector<StreamLayoutMsg> streams;  // <= kMaxWireStreams; offsets relative to `offset`
  bool operator==(const BatchMsg&) const = default;
};
// client -> daemon: the next batch is `step`. Reply: OkMsg (with the new
// generation) or ErrorMsg (refused: nothing moved, the generation stays).
struct SeekMsg {
  uint64_t id = 0;
  uint64_t step = 0;
  bool operator==(const SeekMsg&) const = default;
};
// client -> daemon, no reply: the client dropped its last view of (slot, seq).
// A binary frame (1.3) of kReleaseFrameBytes.
struct ReleaseMsg {
  uint32_t slot = 0;
  uint64_t seq = 0;
  bool operator==(const ReleaseMsg&) const = default;
};
// client -> daemon, no reply (1.2): the caller took the item pushed last
// before this position out of the ready queue; `step` is the step it takes
// next (a batch of step s: s + 1; a pushed error: its `step`). Sent once per
// item taken, in order. The daemon ignores one of an older generation than
// the loader's (sent before a seek it accepted), refuses (protocol error) a
// step behind the last one or beyond what it pushed, and keeps group
// positions by it (docs/protocol.md "Consumed positions").
// `waiting` (one byte, 0 or 1): the caller is blocked in next() with nothing
// queued, at `step` (the position it already reported). Only from then
// until the daemon pushes it an item, or a later `consumed` without the
// flag, does the member wait for peers (its group timeout runs, stats and
// status report it waiting): protocol 1.1's meaning, where only a blocked
// `next` waited. A binary frame (1.3) of kConsumedFrameBytes.
struct ConsumedMsg {
  uint64_t gen = 0;
  uint64_t step = 0;
  bool waiting = false;
  bool operator==(const ConsumedMsg&) const = default;
};
// client -> daemon: counters. Reply: StatsReplyMsg.
struct StatsMsg {
  uint64_t id = 0;
  // Protocol 1.2, optional: also send the status document (the daemon, its
  // groups, members and per-uid usage; docs/daemon.md "Status").
  bool detail = false;
  bool operator==(const StatsMsg&) const = default;
};
// Longest status document (JSON) a stats reply may carry.
inline constexpr uint32_t kMaxStatusBytes = 192 * 1024;
struct StatsReplyMsg {
  uint64_t id = 0;
  std::vector<std::pair<std::string, uint64_t>> counters;
  // Protocol 1.2, optional: the status document (JSON), only when asked for.
  std::string status;
  bool operator==(const StatsReplyMsg&) const = default;
};
// client -> daemon, no reply: close the loader (the connection stays,
// carrying releases, until the client hangs up). Pushing stops.
struct CloseMsg {
  bool operator==(const CloseMsg&) const = default;
};
// daemon -> client reply to seek: accepted.
struct OkMsg {
  uint64_t id = 0;
  uint64_t step = 0;  // the loader's step after the request
  uint64_t gen = 0;   // the generation batches pushed from now on carry
  bool operator==(const OkMsg&) const = default;
};
// daemon -> client: `code` is a Status::Code. Either the reply to request
// `id` (it failed), or, with `gen` instead, pushed in a batch's place: the
// gather of step `step - 1` failed (the client raises it at that step). A
// refusal at hello carries neither.
struct ErrorMsg {
  uint32_t code = 0;
  std::string message;
  // The loader's step after the failed request: a gather error of step s
  // still advances to s+1 (as embedded), a refused request does not.
  uint64_t step = 0;
  std::optional<uint64_t> id;   // a reply to this request
  std::optional<uint64_t> gen;  // pushed: the generation of the failed step
  Status ToStatus() const;
  static ErrorMsg From(const Status& s, uint64_t step = 0);
  bool operator==(const ErrorMsg&) const = default;
};

using Message =
    std::variant<HelloMsg, HelloOkMsg, OpenMsg, OpenedMsg, BatchMsg, SeekMsg, ReleaseMsg, StatsMsg,
                 StatsReplyMsg, CloseMsg, OkMsg, ErrorMsg, HeartbeatMsg, ConsumedMsg>;

// The "t" string of a message ("hello", "batch", ...).
const char* MessageName(const Message& m);

// Serialises one message into a frame (binary for BatchMsg, ReleaseMsg and
// ConsumedMsg, a msgpack map for the others).
std::vector<uint8_t> EncodeMessage(const Message& m);
// Parses one frame strictly (see the header comment). Protocol error otherwise.
Result<Message> DecodeMessage(std::span<const uint8_t> frame);
// Whether `frame` is a binary `batch` frame (its first two bytes; nothing
// else is checked).
bool IsBatchFrame(std::span<const uint8_t> frame);
// Parses a binary `batch` frame into *m as DecodeMessage would, reusing
// m->streams' storage (the client's push-queue path decodes every batch into
// one BatchMsg, so taking a batch allocates nothing). *m is unspecified after
// an error.
Status DecodeBatchFrame(std::span<const uint8_t> frame, BatchMsg* m);

}  // namespace loaderx
