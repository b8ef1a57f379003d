#include "loaderx/wire.h"

#include <array>
#include <bit>
#include <cassert>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <msgpack.hpp>
#include <string_view>
#include <type_traits>

namespace loaderx {

namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

void PackStr(Packer& p, std::string_view s) {
  p.pack_str(static_cast<uint32_t>(s.size()));
  p.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

// Writes "t" and opens the map: `fields` is the number of keys besides "t".
void Begin(Packer& p, const char* type, uint32_t fields) {
  p.pack_map(fields + 1);
  PackStr(p, "t");
  PackStr(p, type);
}

void Key(Packer& p, const char* k) { PackStr(p, k); }

template <typename T>
void KV(Packer& p, const char* k, const T& v) {
  Key(p, k);
  p.pack(v);
}
void KVStr(Packer& p, const char* k, std::string_view v) {
  Key(p, k);
  PackStr(p, v);
}
void KVU64s(Packer& p, const char* k, const std::vector<uint64_t>& v) {
  Key(p, k);
  p.pack_array(static_cast<uint32_t>(v.size()));
  for (uint64_t x : v) p.pack(x);
}

struct Encoder {
  Packer& p;
  void operator()(const HelloMsg& m) {
    Begin(p, "hello", 3);
    KV(p, "major", m.major);
    KV(p, "minor", m.minor);
    KVStr(p, "client_version", m.client_version);
  }
  void operator()(const HelloOkMsg& m) {
    Begin(p, "hello_ok", m.heartbeat_ms != 0 ? 6 : 5);
    KV(p, "major", m.major);
    KV(p, "minor", m.minor);
    KVStr(p, "daemon_version", m.daemon_version);
    KV(p, "incarnation", m.incarnation);
    KV(p, "session", m.session);
    if (m.heartbeat_ms != 0) KV(p, "heartbeat_ms", m.heartbeat_ms);
  }
  void operator()(const HeartbeatMsg&) { Begin(p, "heartbeat", 0); }
  void operator()(const OpenMsg& m) {
    // The 1.1 keys only travel with a group, so a solo open is a 1.0 frame.
    const bool grouped = !m.group.empty();
    const bool join = grouped && m.join != GroupJoin::kDefault;
    const bool timeout = grouped && m.group_timeout_ms != 0;
    const bool mixed = !m.mix_counts.empty();
    const bool ranks = grouped && m.ranks_count != 0;
    const bool replicas = grouped && m.replicas != 1;
    const bool scheduled = m.mix_datasets != 0;
    Begin(p, "open",
          11 + (grouped ? 2 : 0) + (join ? 1 : 0) + (timeout ? 1 : 0) + (mixed ? 1 : 0) +
              (m.push_queue ? 1 : 0) + (ranks ? 2 : 0) + (replicas ? 1 : 0) + (scheduled ? 2 : 0));
    KV(p, "id", m.id);
    Key(p, "streams");
    p.pack_array(static_cast<uint32_t>(m.streams.size()));
    for (const StreamFilesMsg& s : m.streams) {
      // Plain stores keep the 1.0 shape (no "mix" key).
      const bool role = s.role != StreamRole::kStore;
      p.pack_map(4 + (role ? 1 : 0));
      KVStr(p, "label", s.label);
      KV(p, "has_shapes", s.has_shapes);
      KV(p, "has_dict", s.has_dict);
      KV(p, "data_files", s.data_files);
      if (role) KV(p, "mix", static_cast<uint32_t>(s.role));
    }
    if (mixed) KVU64s(p, "mix_counts", m.mix_counts);
    if (scheduled) {
      KV(p, "mix_datasets", m.mix_datasets);
      KVU64s(p, "segments", m.segments);
    }
    KV(p, "batch_size", m.batch_size);
    KV(p, "mode", m.mode);
    KV(p, "seed", m.seed);
    KV(p, "rank", m.rank);
    KV(p, "world_size", m.world_size);
    KV(p, "start_step", m.start_step);
    KV(p, "prefetch", m.prefetch);
    KV(p, "leases", m.leases);
    KV(p, "ring_bytes", m.ring_bytes);
    if (grouped) {
      KVStr(p, "group", m.group);
      KVStr(p, "group_mode", GroupModeName(m.group_mode));
    }
    if (join) KVStr(p, "join", GroupJoinName(m.join));
    if (timeout) KV(p, "group_timeout_ms", m.group_timeout_ms);
    if (m.push_queue) KV(p, "push_queue", true);
    if (ranks) {
      KV(p, "ranks_first", m.ranks_first);
      KV(p, "ranks_count", m.ranks_count);
    }
    if (replicas) KV(p, "replicas", m.replicas);
  }
  void operator()(const OpenedMsg& m) {
    Begin(p, "opened", 6 + (m.step ? 1 : 0) + (m.queue_bytes != 0 ? 1 : 0));
    KV(p, "id", m.id);
    KV(p, "n", m.n);
    KV(p, "slot_count", m.slot_count);
    KV(p, "ring_bytes", m.ring_bytes);
    KV(p, "leases", m.leases);
    Key(p, "streams");
    p.pack_array(static_cast<uint32_t>(m.streams.size()));
    for (const StreamSchemaMsg& s : m.streams) {
      p.pack_map(5);
      KV(p, "kind", s.kind);
      KVStr(p, "dtype", s.dtype);
      KVU64s(p, "item_shape", s.item_shape);
      KV(p, "ndim", s.ndim);
      KV(p, "size", s.size);
    }
    if (m.step) KV(p, "step", *m.step);
    if (m.queue_bytes != 0) KV(p, "queue_bytes", m.queue_bytes);
  }
  void operator()(const SeekMsg& m) {
    Begin(p, "seek", 2);
    KV(p, "id", m.id);
    KV(p, "step", m.step);
  }
  void operator()(const StatsMsg& m) {
    Begin(p, "stats", m.detail ? 2 : 1);
    KV(p, "id", m.id);
    if (m.detail) KV(p, "detail", true);
  }
  void operator()(const StatsReplyMsg& m) {
    Begin(p, "stats_reply", m.status.empty() ? 2 : 3);
    KV(p, "id", m.id);
    if (!m.status.empty()) KVStr(p, "status", m.status);
    Key(p, "counters");
    p.pack_map(static_cast<uint32_t>(m.counters.size()));
    for (const auto& [k, v] : m.counters) {
      PackStr(p, k);
      p.pack(v);
    }
  }
  void operator()(const CloseMsg&) { Begin(p, "close", 0); }
  void operator()(const OkMsg& m) {
    Begin(p, "ok", 3);
    KV(p, "id", m.id);
    KV(p, "step", m.step);
    KV(p, "gen", m.gen);
  }
  void operator()(const ErrorMsg& m) {
    Begin(p, "error", 3 + (m.id ? 1 : 0) + (m.gen ? 1 : 0));
    KV(p, "code", m.code);
    KVStr(p, "message", m.message);
    KV(p, "step", m.step);
    if (m.id) KV(p, "id", *m.id);
    if (m.gen) KV(p, "gen", *m.gen);
  }
};

// ---- decoding ---------------------------------------------------------------

// Reads the fields of one msgpack map, remembering which keys were consumed
// so Finish() can reject unknown ones.
class Fields {
 public:
  Fields(const msgpack::object& map, std::string what) : what_(std::move(what)) {
    if (map.type != msgpack::type::MAP) {
      st_ = Status::Protocol(what_ + ": expected a map");
      return;
    }
    keys_.reserve(map.via.map.size);
    for (uint32_t i = 0; i < map.via.map.size; ++i) {
      const msgpack::object_kv& kv = map.via.map.ptr[i];
      if (kv.key.type != msgpack::type::STR) {
        st_ = Status::Protocol(what_ + ": map key is not a string");
        return;
      }
      std::string_view k(kv.key.via.str.ptr, kv.key.via.str.size);
      if (Find(k) != nullptr) {
        st_ = Status::Protocol(what_ + ": duplicate key '" + std::string(k) + "'");
        return;
      }
      keys_.push_back(Entry{k, &kv.val, false});
    }
  }

  // True if the (optional) key is present; Get() it to consume it.
  bool Has(std::string_view key) const { return st_.ok() && Find(key) != nullptr; }

  const msgpack::object* Get(std::string_view key) {
    if (!st_.ok()) return nullptr;
    Entry* e = Find(key);
    if (e == nullptr) {
      Fail("missing key '" + std::string(key) + "'");
      return nullptr;
    }
    e->used = true;
    return e->value;
  }

  uint64_t U64(std::string_view key, uint64_t max = std::numeric_limits<uint64_t>::max()) {
    const msgpack::object* o = Get(key);
    if (o == nullptr) return 0;
    return AsU64(*o, key, max);
  }
  uint32_t U32(std::string_view key, uint32_t max = std::numeric_limits<uint32_t>::max()) {
    return static_cast<uint32_t>(U64(key, max));
  }
  bool Bool(std::string_view key) {
    const msgpack::object* o = Get(key);
    if (o == nullptr) return false;
    if (o->type != msgpack::type::BOOLEAN) {
      Fail("'" + std::string(key) + "' must be a boolean");
      return false;
    }
    return o->via.boolean;
  }
  std::string Str(std::string_view key, uint32_t max = kMaxWireString) {
    const msgpack::object* o = Get(key);
    if (o == nullptr) return {};
    if (o->type != msgpack::type::STR || o->via.str.size > max) {
      Fail("'" + std::string(key) + "' must be a string of at most " + std::to_string(max) +
           " bytes");
      return {};
    }
    return std::string(o->via.str.ptr, o->via.str.size);
  }
  // Array of at most `max` elements; nullptr (and a failure) otherwise.
  const msgpack::object_array* Array(std::string_view key, uint32_t max) {
    const msgpack::object* o = Get(key);
    if (o == nullptr) return nullptr;
    return AsArray(*o, key, max);
  }

  uint64_t AsU64(const msgpack::object& o, std::string_view key, uint64_t max) {
    if (o.type != msgpack::type::POSITIVE_INTEGER) {
      Fail("'" + std::string(key) + "' must be a non-negative integer");
      return 0;
    }
    if (o.via.u64 > max) {
      Fail("'" + std::string(key) + "' = " + std::to_string(o.via.u64) + " exceeds " +
           std::to_string(max));
      return 0;
    }
    return o.via.u64;
  }
  const msgpack::object_array* AsArray(const msgpack::object& o, std::string_view key,
                                       uint32_t max) {
    if (o.type != msgpack::type::ARRAY || o.via.array.size > max) {
      Fail("'" + std::string(key) + "' must be an array of at most " + std::to_string(max) +
           " elements");
      return nullptr;
    }
    return &o.via.array;
  }

  void Fail(const std::string& msg) {
    if (st_.ok()) st_ = Status::Protocol(what_ + ": " + msg);
  }

  // OK iff nothing failed and every key was consumed.
  Status Finish() {
    if (!st_.ok()) return st_;
    for (const Entry& e : keys_) {
      if (!e.used) return Status::Protocol(what_ + ": unknown key '" + std::string(e.key) + "'");
    }
    return Status::OK();
  }
  bool ok() const { return st_.ok(); }

 private:
  struct Entry {
    std::string_view key;
    const msgpack::object* value;
    bool used;  // consumed by Get
  };
  // A message has a handful of keys (at most 128, the unpack limit): a flat
  // list searched linearly, one allocation, instead of a tree node per key
  // and per consumed key. Every batch hand-off decodes one of these.
  Entry* Find(std::string_view key) {
    for (Entry& e : keys_) {
      if (e.key == key) return &e;
    }
    return nullptr;
  }
  const Entry* Find(std::string_view key) const { return const_cast<Fields*>(this)->Find(key); }

  std::string what_;
  Status st_;
  std::vector<Entry> keys_;  // in message order
};

template <typename T>
Result<Message> Done(Fields& f, T msg) {
  LX_RETURN_IF_ERROR(f.Finish());
  return Message(std::move(msg));
}

Result<Message> DecodeHello(Fields& f) {
  HelloMsg m;
  m.major = f.U32("major");
  m.minor = f.U32("minor");
  m.client_version = f.Str("client_version");
  return Done(f, std::move(m));
}

Result<Message> DecodeHelloOk(Fields& f) {
  HelloOkMsg m;
  m.major = f.U32("major");
  m.minor = f.U32("minor");
  m.daemon_version = f.Str("daemon_version");
  m.incarnation = f.U64("incarnation");
  m.session = f.U64("session");
  if (f.Has("heartbeat_ms")) m.heartbeat_ms = f.U32("heartbeat_ms", 60'000);
  return Done(f, std::move(m));
}

// open's streams: their files and roles.
Status DecodeOpenStreams(Fields& f, OpenMsg& m) {
  if (const msgpack::object_array* a = f.Array("streams", kMaxWireStreams)) {
    if (a->size == 0) f.Fail("'streams' must not be empty");
    for (uint32_t i = 0; i < a->size && f.ok(); ++i) {
      Fields s(a->ptr[i], "open.streams[" + std::to_string(i) + "]");
      StreamFilesMsg sf;
      sf.label = s.Str("label");
      sf.has_shapes = s.Bool("has_shapes");
      sf.has_dict = s.Bool("has_dict");
      sf.data_files = s.U32("data_files", kMaxWireDataFiles);
      if (s.Has("mix")) sf.role = static_cast<StreamRole>(s.U32("mix", 2));
      if (sf.role == StreamRole::kMixSource) {
        if (s.ok() && (sf.has_shapes || sf.has_dict || sf.data_files != 0)) {
          s.Fail("a mix source stream (\"mix\": 2) has no files");
        }
      } else if (s.ok() && sf.data_files == 0) {
        s.Fail("'data_files' must be >= 1");
      }
      Status st = s.Finish();
      if (!st.ok()) return st;
      m.streams.push_back(std::move(sf));
    }
  }
  return Status::OK();
}

// open's group fields (protocol 1.1, 1.2 and 1.5; all optional).
void DecodeOpenGroup(Fields& f, OpenMsg& m) {
  if (f.Has("group")) {
    m.group = f.Str("group");
    if (f.ok() && (m.group.empty() || m.group.size() > kMaxGroupName)) {
      f.Fail("'group' must be 1.." + std::to_string(kMaxGroupName) + " bytes");
    }
    if (std::optional<GroupMode> mode = ParseGroupMode(f.Str("group_mode"))) {
      m.group_mode = *mode;
    } else {
      f.Fail("'group_mode' must be \"shard\" or \"broadcast\"");
    }
    if (f.Has("join")) {
      if (std::optional<GroupJoin> join = ParseGroupJoin(f.Str("join"))) {
        m.join = *join;
      } else {
        f.Fail("'join' must be \"start_step\" or \"current\"");
      }
    }
    // Protocol 1.2 (optional): at most a day.
    if (f.Has("group_timeout_ms")) m.group_timeout_ms = f.U64("group_timeout_ms", 86'400'000);
    // Protocol 1.5 (optional, shard groups): the shape here, the values
    // against world_size and rank by the daemon (Group::CheckMemberSpec).
    if (f.Has("ranks_first") || f.Has("ranks_count")) {
      m.ranks_first = f.U64("ranks_first");
      m.ranks_count = f.U64("ranks_count");
      if (f.ok() && m.ranks_count == 0) f.Fail("'ranks_count' must be at least 1");
    }
    if (f.Has("replicas")) {
      m.replicas = f.U32("replicas", kMaxReplicas);
      if (f.ok() && m.replicas == 0) f.Fail("'replicas' must be at least 1");
    }
    if (f.ok() && m.group_mode != GroupMode::kShard && (m.ranks_count != 0 || m.replicas != 1)) {
      f.Fail("'ranks_first', 'ranks_count' and 'replicas' are for shard groups");
    }
  } else if (f.Has("group_mode") || f.Has("join") || f.Has("group_timeout_ms") ||
             f.Has("ranks_first") || f.Has("ranks_count") || f.Has("replicas")) {
    f.Fail(
        "'group_mode', 'join', 'group_timeout_ms', 'ranks_first', 'ranks_count' and "
        "'replicas' need a 'group'");
  }
}

// open's mixture counts (protocol 1.2) and schedule (1.6), optional: their shape is checked
// here (and by CheckOpenMixRuns), the counts' values and the parts'
// schemas by the daemon (loaderx/mix.h).
void DecodeOpenMix(Fields& f, OpenMsg& m) {
  if (f.Has("mix_counts")) {
    if (const msgpack::object_array* a =
            f.Array("mix_counts", kMaxWireStreams * kMaxWireSegments)) {
      if (a->size == 0) f.Fail("'mix_counts' must not be empty");
      for (uint32_t i = 0; i < a->size && f.ok(); ++i) {
        m.mix_counts.push_back(f.AsU64(a->ptr[i], "mix_counts", UINT64_MAX));
      }
    }
  }
  // Protocol 1.6 (optional): a mixture schedule, K datasets and the
  // sampler segments (their values are checked by the daemon).
  if (f.Has("mix_datasets") || f.Has("segments")) {
    m.mix_datasets = f.U64("mix_datasets", kMaxWireStreams);
    if (const msgpack::object_array* a = f.Array("segments", 3 * kMaxWireSegments)) {
      for (uint32_t i = 0; i < a->size && f.ok(); ++i) {
        m.segments.push_back(f.AsU64(a->ptr[i], "segments", UINT64_MAX));
      }
    }
    if (f.ok() && (m.mix_datasets == 0 || m.mix_counts.empty() ||
                   m.mix_counts.size() % m.mix_datasets != 0)) {
      f.Fail("'mix_datasets' must be > 0 and divide the number of 'mix_counts'");
    } else if (f.ok() && (m.segments.empty() || m.segments.size() % 3 != 0 ||
                          m.segments.size() / 3 != m.mix_counts.size() / m.mix_datasets)) {
      f.Fail("'segments' needs 3 values per segment, one segment per " +
             std::to_string(m.mix_datasets) + " 'mix_counts'");
    }
  } else if (f.ok() && m.mix_counts.size() > kMaxWireStreams) {
    f.Fail("more than " + std::to_string(kMaxWireStreams) + " 'mix_counts' without a schedule");
  }
}

// open's streams against its mixture: mixed streams are runs of K parts (a
// run of 2K is two streams), at most one dataset-number stream.
void CheckOpenMixRuns(Fields& f, const OpenMsg& m) {
  if (!f.ok()) return;
  const uint64_t k = m.mix_datasets != 0 ? m.mix_datasets : m.mix_counts.size();
  uint64_t run = 0, parts = 0, sources = 0;
  bool whole = true;
  for (const StreamFilesMsg& s : m.streams) {
    if (s.role == StreamRole::kMixPart) {
      ++run;
      ++parts;
      continue;
    }
    whole &= k == 0 || run % k == 0;
    run = 0;
    sources += s.role == StreamRole::kMixSource;
  }
  whole &= k == 0 || run % k == 0;
  if (k == 0 && parts + sources != 0) {
    f.Fail("mix streams need 'mix_counts'");
  } else if (k != 0 && parts + sources == 0) {
    f.Fail("'mix_counts' without mix streams");
  } else if (!whole) {
    f.Fail("every mixed stream needs exactly " + std::to_string(k) +
           " consecutive parts (one per count in 'mix_counts')");
  } else if (sources > 1) {
    f.Fail("at most one mix source stream");
  }
}

Result<Message> DecodeOpen(Fields& f) {
  OpenMsg m;
  m.id = f.U64("id");
  LX_RETURN_IF_ERROR(DecodeOpenStreams(f, m));
  m.batch_size = f.U64("batch_size");
  m.mode = f.U32("mode", 2);
  m.seed = f.U64("seed");
  m.rank = f.U64("rank");
  m.world_size = f.U64("world_size");
  m.start_step = f.U64("start_step");
  m.prefetch = f.U32("prefetch", 1024);
  m.leases = f.U32("leases", 1024);
  m.ring_bytes = f.U64("ring_bytes", uint64_t{1} << 46);
  DecodeOpenGroup(f, m);
  DecodeOpenMix(f, m);
  // Protocol 1.4 (optional): only ever sent as true.
  if (f.Has("push_queue")) {
    m.push_queue = f.Bool("push_queue");
    if (f.ok() && !m.push_queue) f.Fail("'push_queue' is sent only as true");
  }
  CheckOpenMixRuns(f, m);
  return Done(f, std::move(m));
}

Result<Message> DecodeOpened(Fields& f) {
  OpenedMsg m;
  m.id = f.U64("id");
  m.n = f.U64("n");
  m.slot_count = f.U32("slot_count");
  m.ring_bytes = f.U64("ring_bytes");
  m.leases = f.U32("leases");
  if (const msgpack::object_array* a = f.Array("streams", kMaxWireStreams)) {
    for (uint32_t i = 0; i < a->size && f.ok(); ++i) {
      Fields s(a->ptr[i], "opened.streams[" + std::to_string(i) + "]");
      StreamSchemaMsg ss;
      ss.kind = s.U32("kind", 1);
      ss.dtype = s.Str("dtype");
      if (const msgpack::object_array* dims = s.Array("item_shape", kMaxWireDims)) {
        for (uint32_t d = 0; d < dims->size; ++d) {
          ss.item_shape.push_back(s.AsU64(dims->ptr[d], "item_shape", UINT64_MAX));
        }
      }
      ss.ndim = s.U32("ndim", kMaxWireDims);
      ss.size = s.U64("size");
      Status st = s.Finish();
      if (!st.ok()) return st;
      m.streams.push_back(std::move(ss));
    }
  }
  if (f.Has("step")) m.step = f.U64("step");
  // Protocol 1.4 (optional): never 0 when sent.
  if (f.Has("queue_bytes")) {
    m.queue_bytes = f.U64("queue_bytes", uint64_t{1} << 32);
    if (f.ok() && m.queue_bytes == 0) f.Fail("'queue_bytes' must be > 0");
  }
  return Done(f, std::move(m));
}

Result<Message> DecodeSeek(Fields& f) {
  SeekMsg m;
  m.id = f.U64("id");
  m.step = f.U64("step");
  return Done(f, m);
}

Result<Message> DecodeStats(Fields& f) {
  StatsMsg m;
  m.id = f.U64("id");
  if (f.Has("detail")) m.detail = f.Bool("detail");
  return Done(f, m);
}

Result<Message> DecodeStatsReply(Fields& f) {
  StatsReplyMsg m;
  m.id = f.U64("id");
  if (f.Has("status")) m.status = f.Str("status", kMaxStatusBytes);
  if (const msgpack::object* o = f.Get("counters")) {
    if (o->type != msgpack::type::MAP) {
      f.Fail("'counters' must be a map");
    } else {
      for (uint32_t i = 0; i < o->via.map.size && f.ok(); ++i) {
        const msgpack::object_kv& kv = o->via.map.ptr[i];
        if (kv.key.type != msgpack::type::STR) {
          f.Fail("counter name must be a string");
          break;
        }
        m.counters.emplace_back(std::string(kv.key.via.str.ptr, kv.key.via.str.size),
                                f.AsU64(kv.val, "counter", UINT64_MAX));
      }
    }
  }
  return Done(f, std::move(m));
}

Result<Message> DecodeOk(Fields& f) {
  OkMsg m;
  m.id = f.U64("id");
  m.step = f.U64("step");
  m.gen = f.U64("gen");
  return Done(f, m);
}

Result<Message> DecodeError(Fields& f) {
  ErrorMsg m;
  m.code = f.U32("code", static_cast<uint32_t>(Status::Code::kTimeout));
  m.message = f.Str("message");
  m.step = f.U64("step");
  if (f.Has("id")) m.id = f.U64("id");
  if (f.Has("gen")) m.gen = f.U64("gen");
  if (f.ok() && m.code == 0) f.Fail("error code must not be 0 (OK)");
  if (f.ok() && m.id && m.gen) f.Fail("an error is a reply ('id') or pushed ('gen'), not both");
  return Done(f, std::move(m));
}

Result<Message> DecodeClose(Fields& f) { return Done(f, CloseMsg{}); }

Result<Message> DecodeHeartbeat(Fields& f) { return Done(f, HeartbeatMsg{}); }

// One decoder per msgpack message type, found by its "type".
struct TypedDecoder {
  std::string_view type;
  Result<Message> (*decode)(Fields& f);
};
constexpr std::array<TypedDecoder, 11> kTypedDecoders{{
    {"hello", DecodeHello},
    {"hello_ok", DecodeHelloOk},
    {"open", DecodeOpen},
    {"opened", DecodeOpened},
    {"seek", DecodeSeek},
    {"stats", DecodeStats},
    {"stats_reply", DecodeStatsReply},
    {"ok", DecodeOk},
    {"error", DecodeError},
    {"close", DecodeClose},
    {"heartbeat", DecodeHeartbeat},
}};

Result<Message> DecodeTyped(std::string_view t, Fields& f) {
  for (const TypedDecoder& d : kTypedDecoders) {
    if (d.type == t) return d.decode(f);
  }
  if (t == "batch" || t == "release" || t == "consumed") {
    return Status::Protocol("message '" + std::string(t) +
                            "' must be a binary frame (protocol 1.3), not a msgpack map");
  }
  return Status::Protocol("unknown message type '" + std::string(t) + "'");
}

// ---- binary frames (protocol 1.3: batch, release, consumed) -----------------
//
// Fixed little-endian fields at fixed offsets, copied with memcpy (no
// alignment). The layout is docs/protocol.md "Encoding"; the sizes are in
// wire.h. Each encoder writes exactly its frame size (asserted at the end).

static_assert(std::endian::native == std::endian::little,
              "binary wire frames are little-endian; big-endian hosts are unsupported");

class FrameWriter {
 public:
  FrameWriter(BinaryType type, size_t bytes) : out_(bytes) {
    Put(kBinaryFrameMark);
    Put(static_cast<uint8_t>(type));
  }
  template <typename T>
  void Put(T v) {
    assert(at_ + sizeof v <= out_.size());
    std::memcpy(out_.data() + at_, &v, sizeof v);
    at_ += sizeof v;
  }
  std::vector<uint8_t> Done() {
    assert(at_ == out_.size());
    return std::move(out_);
  }

 private:
  std::vector<uint8_t> out_;
  size_t at_ = 0;
};

// Reads fields in order from a frame whose length the caller has checked.
class FrameReader {
 public:
  explicit FrameReader(std::span<const uint8_t> frame) : p_(frame.data() + 2) {}
  template <typename T>
  T Get() {
    T v;
    std::memcpy(&v, p_, sizeof v);
    p_ += sizeof v;
    return v;
  }

 private:
  const uint8_t* p_;
};

std::vector<uint8_t> EncodeBinary(const BatchMsg& m) {
  // Only the daemon encodes a batch, from its own layouts: never more than
  // the decoder accepts (a u8 count).
  assert(m.streams.size() <= kMaxWireStreams);
  FrameWriter w(BinaryType::kBatch, BatchFrameBytes(m.streams.size()));
  w.Put(m.gen);
  w.Put(m.step);
  w.Put(m.slot);
  w.Put(m.seq);
  w.Put(m.offset);
  w.Put(m.batch_size);
  w.Put(m.total_bytes);
  w.Put(static_cast<uint8_t>(m.streams.size()));
  for (const StreamLayoutMsg& s : m.streams) {
    w.Put(static_cast<uint8_t>(s.kind));
    w.Put(s.values_offset);
    w.Put(s.values_bytes);
    w.Put(s.shapes_offset);
    w.Put(s.offsets_offset);
  }
  return w.Done();
}
std::vector<uint8_t> EncodeBinary(const ReleaseMsg& m) {
  FrameWriter w(BinaryType::kRelease, kReleaseFrameBytes);
  w.Put(m.slot);
  w.Put(m.seq);
  return w.Done();
}
std::vector<uint8_t> EncodeBinary(const ConsumedMsg& m) {
  FrameWriter w(BinaryType::kConsumed, kConsumedFrameBytes);
  w.Put(m.gen);
  w.Put(m.step);
  w.Put(static_cast<uint8_t>(m.waiting ? 1 : 0));
  return w.Done();
}

template <typename T>
constexpr bool kIsBinary =
    std::is_same_v<T, BatchMsg> || std::is_same_v<T, ReleaseMsg> || std::is_same_v<T, ConsumedMsg>;

Status WrongLength(const char* type, size_t got, size_t want, const std::string& why = {}) {
  return Status::Protocol(std::string(type) + ": binary frame of " + std::to_string(got) +
                          " bytes, expected " + std::to_string(want) + why);
}

Result<Message> DecodeBatch(std::span<const uint8_t> frame) {
  BatchMsg m;
  LX_RETURN_IF_ERROR(DecodeBatchFrame(frame, &m));
  return Message(std::move(m));
}

Result<Message> DecodeBinary(std::span<const uint8_t> frame) {
  if (frame.size() < 2) return Status::Protocol("binary frame of 1 byte: no type byte");
  switch (static_cast<BinaryType>(frame[1])) {
    case BinaryType::kBatch:
      return DecodeBatch(frame);
    case BinaryType::kRelease: {
      if (frame.size() != kReleaseFrameBytes) {
        return WrongLength("release", frame.size(), kReleaseFrameBytes);
      }
      FrameReader r(frame);
      ReleaseMsg m;
      m.slot = r.Get<uint32_t>();
      m.seq = r.Get<uint64_t>();
      return Message(m);
    }
    case BinaryType::kConsumed: {
      if (frame.size() != kConsumedFrameBytes) {
        return WrongLength("consumed", frame.size(), kConsumedFrameBytes);
      }
      FrameReader r(frame);
      ConsumedMsg m;
      m.gen = r.Get<uint64_t>();
      m.step = r.Get<uint64_t>();
      const uint8_t waiting = r.Get<uint8_t>();
      if (waiting > 1) {
        return Status::Protocol("consumed: 'waiting' is " + std::to_string(waiting) + " (0 or 1)");
      }
      m.waiting = waiting == 1;
      return Message(m);
    }
  }
  char hex[8];
  std::snprintf(hex, sizeof hex, "0x%02x", frame[1]);
  return Status::Protocol(std::string("unknown binary message type ") + hex);
}

}  // namespace

bool IsBatchFrame(std::span<const uint8_t> frame) {
  return frame.size() >= 2 && frame[0] == kBinaryFrameMark &&
         frame[1] == static_cast<uint8_t>(BinaryType::kBatch);
}

Status DecodeBatchFrame(std::span<const uint8_t> frame, BatchMsg* out) {
  if (frame.size() < kBatchFrameHeaderBytes) {
    return WrongLength("batch", frame.size(), kBatchFrameHeaderBytes, " or more");
  }
  FrameReader r(frame);
  BatchMsg& m = *out;
  m.gen = r.Get<uint64_t>();
  m.step = r.Get<uint64_t>();
  m.slot = r.Get<uint32_t>();
  m.seq = r.Get<uint64_t>();
  m.offset = r.Get<uint64_t>();
  m.batch_size = r.Get<uint64_t>();
  m.total_bytes = r.Get<uint64_t>();
  const uint32_t streams = r.Get<uint8_t>();
  if (streams > kMaxWireStreams) {
    return Status::Protocol("batch: " + std::to_string(streams) + " streams exceeds " +
                            std::to_string(kMaxWireStreams));
  }
  if (frame.size() != BatchFrameBytes(streams)) {
    return WrongLength("batch", frame.size(), BatchFrameBytes(streams),
                       " for " + std::to_string(streams) + " streams");
  }
  m.streams.resize(streams);
  for (uint32_t i = 0; i < streams; ++i) {
    StreamLayoutMsg& l = m.streams[i];
    l.kind = r.Get<uint8_t>();
    if (l.kind > 1) {
      return Status::Protocol("batch: streams[" + std::to_string(i) + "] kind " +
                              std::to_string(l.kind) + " (0 dense or 1 ragged)");
    }
    l.values_offset = r.Get<uint64_t>();
    l.values_bytes = r.Get<uint64_t>();
    l.shapes_offset = r.Get<uint64_t>();
    l.offsets_offset = r.Get<uint64_t>();
  }
  return Status::OK();
}

std::optional<GroupMode> ParseGroupMode(std::string_view name) {
  for (GroupMode m : {GroupMode::kShard, GroupMode::kBroadcast}) {
    if (name == GroupModeName(m)) return m;
  }
  return std::nullopt;
}

std::optional<GroupJoin> ParseGroupJoin(std::string_view name) {
  for (GroupJoin j : {GroupJoin::kStartStep, GroupJoin::kCurrent}) {
    if (name == GroupJoinName(j)) return j;
  }
  return std::nullopt;
}

const char* GroupModeName(GroupMode mode) {
  return mode == GroupMode::kBroadcast ? "broadcast" : "shard";
}

const char* GroupJoinName(GroupJoin join) {
  switch (join) {
    case GroupJoin::kStartStep:
      return "start_step";
    case GroupJoin::kCurrent:
      return "current";
    case GroupJoin::kDefault:
      break;
  }
  return "default";
}

uint32_t OpenMsg::TotalFds() const {
  uint32_t n = 0;
  for (const StreamFilesMsg& s : streams) n += s.FdCount();
  return n;
}

Status ErrorMsg::ToStatus() const { return Status(static_cast<Status::Code>(code), message); }

ErrorMsg ErrorMsg::From(const Status& s, uint64_t step) {
  return ErrorMsg{static_cast<uint32_t>(s.code()), s.message(), step, std::nullopt, std::nullopt};
}

const char* MessageName(const Message& m) {
  static constexpr const char* kNames[] = {"hello", "hello_ok", "open",      "opened",      "batch",
                                           "seek",  "release",  "stats",     "stats_reply", "close",
                                           "ok",    "error",    "heartbeat", "consumed"};
  static_assert(std::size(kNames) == std::variant_size_v<Message>);
  return kNames[m.index()];
}

std::vector<uint8_t> EncodeMessage(const Message& m) {
  return std::visit(
      [](const auto& msg) -> std::vector<uint8_t> {
        if constexpr (kIsBinary<std::decay_t<decltype(msg)>>) {
          return EncodeBinary(msg);
        } else {
          msgpack::sbuffer buf(256);
          Packer p(buf);
          Encoder{p}(msg);
          const uint8_t* d = reinterpret_cast<const uint8_t*>(buf.data());
          return std::vector<uint8_t>(d, d + buf.size());
        }
      },
      m);
}

Result<Message> DecodeMessage(std::span<const uint8_t> frame) {
  if (frame.empty()) return Status::Protocol("empty frame");
  if (frame[0] == kBinaryFrameMark) return DecodeBinary(frame);
  // Caps are checked by the parser before it allocates: a 4-byte header
  // claiming a 4 GiB array is refused, not honoured.
  // Strings: the longest any field may be (the status document); each
  // field's own cap (Fields::Str) is checked after parsing.
  msgpack::unpack_limit limit(/*array=*/4096, /*map=*/128, /*str=*/kMaxStatusBytes,
                              /*bin=*/0, /*ext=*/0, /*depth=*/6);
  // The parsed objects live in this thread's zone, emptied when the decode
  // ends (every field is copied into the Message first): one chunk reused
  // for every message instead of a zone allocated and freed per message.
  thread_local msgpack::zone zone;
  struct ClearZone {
    ~ClearZone() { zone.clear(); }
  } clear_zone;
  try {
    size_t off = 0;
    const msgpack::object root = msgpack::unpack(zone, reinterpret_cast<const char*>(frame.data()),
                                                 frame.size(), off, nullptr, nullptr, limit);
    if (off != frame.size()) {
      return Status::Protocol("trailing bytes after the message (" +
                              std::to_string(frame.size() - off) + ")");
    }
    Fields f(root, "message");
    if (!f.ok()) return f.Finish();
    const msgpack::object* t = f.Get("t");
    if (t == nullptr) return f.Finish();
    if (t->type != msgpack::type::STR || t->via.str.size > 32) {
      return Status::Protocol("message: 't' must be a short string");
    }
    std::string_view type(t->via.str.ptr, t->via.str.size);
    Fields typed(root, std::string(type));
    typed.Get("t");
    return DecodeTyped(type, typed);
  } catch (const std::exception& e) {
    return Status::Protocol(std::string("malformed msgpack: ") + e.what());
  }
}

}  // namespace loaderx
