#include "status.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>

#include "loaderx/wire.h"

namespace loaderx::daemon {

namespace {

// A minimal JSON writer: objects and arrays of numbers, strings, bools, null.
class Json {
 public:
  Json& Open(char c) {
    Sep();
    out_ += c;
    first_ = true;
    return *this;
  }
  Json& Close(char c) {
    out_ += c;
    first_ = false;
    return *this;
  }
  Json& Key(const std::string& k) {
    Sep();
    Str(k);
    out_ += ':';
    first_ = true;  // the value follows without a comma
    return *this;
  }
  Json& U(uint64_t v) {
    Sep();
    out_ += std::to_string(v);
    return *this;
  }
  Json& I(int64_t v) {
    Sep();
    out_ += std::to_string(v);
    return *this;
  }
  Json& D(double v) {
    Sep();
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3f", std::isfinite(v) ? v : 0.0);
    out_ += buf;
    return *this;
  }
  Json& B(bool v) {
    Sep();
    out_ += v ? "true" : "false";
    return *this;
  }
  Json& Null() {
    Sep();
    out_ += "null";
    return *this;
  }
  Json& S(const std::string& v) {
    Sep();
    Str(v);
    return *this;
  }
  size_t size() const { return out_.size(); }
  std::string& str() { return out_; }

 private:
  void Sep() {
    if (!first_) out_ += ',';
    first_ = false;
  }
  void Str(const std::string& v) {
    out_ += '"';
    for (unsigned char c : v) {
      if (c == '"' || c == '\\') {
        out_ += '\\';
        out_ += static_cast<char>(c);
      } else if (c < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", c);
        out_ += buf;
      } else {
        out_ += static_cast<char>(c);  // UTF-8 passes through
      }
    }
    out_ += '"';
  }

  std::string out_;
  bool first_ = true;
};

void Held(Json& j, const Group::Snapshot& g) {
  j.Key("oldest_held");
  g.holds ? j.U(g.oldest_held) : j.Null();
  j.Key("newest_held");
  g.holds ? j.U(g.newest_held) : j.Null();
  j.Key("next_gather").U(g.produced);
  j.Key("ring_bytes").U(g.ring_bytes);
  j.Key("slots").U(g.slots);
  j.Key("live_slots").U(g.live_slots);
  j.Key("max_live").U(g.max_live);
  j.Key("batches_gathered").U(g.gathered);
  j.Key("batches_served").U(g.served);
}

void Member(Json& j, const Group::Snapshot::MemberRow& m, bool shard, uint32_t replicas) {
  j.Open('{');
  j.Key("session").U(m.session);
  j.Key("pid").I(m.info.pid);
  j.Key("uid").U(m.info.uid);
  j.Key("rank");
  shard ? j.U(m.info.rank) : j.Null();
  j.Key("replica");
  shard ? j.U(m.position % replicas) : j.Null();
  j.Key("cursor").U(m.cursor);
  j.Key("batches_served").U(m.served);
  j.Key("group_timeout_s").D(std::chrono::duration<double>(m.info.timeout).count());
  j.Close('}');
}

void NamedGroup(Json& j, uint32_t uid, const Group::Snapshot& g) {
  const bool shard = g.mode == GroupMode::kShard;
  j.Open('{');
  j.Key("name").S(g.name);
  j.Key("uid").U(uid);
  j.Key("mode").S(GroupModeName(g.mode));
  j.Key("batch_size").U(g.batch_size);
  j.Key("world_size").U(g.world_size);
  j.Key("members").Open('[');
  for (const auto& m : g.members) Member(j, m, shard, g.replicas);
  j.Close(']');
  j.Key("rank_cursors");
  if (shard) {
    j.Open('[');
    for (uint64_t c : g.rank_cursors) j.U(c);
    j.Close(']');
    j.Key("ranks_first").U(g.ranks_first);
    j.Key("ranks_count").U(g.ranks_count);
    j.Key("replicas").U(g.replicas);
  } else {
    j.Null();
  }
  Held(j, g);
  j.Key("waiting");
  if (g.waiting) {
    j.Open('{');
    j.Key(shard ? "ranks" : "sessions").Open('[');
    // Shard: positions, named by their rank (a rank once per replica).
    for (uint64_t w : g.waits_for) j.U(shard ? g.ranks_first + w / g.replicas : w);
    j.Close(']');
    j.Key("step").U(g.waits_at_step);
    j.Key("since_s").D(static_cast<double>(g.waiting_ms) / 1000.0);
    j.Close('}');
  } else {
    j.Null();
  }
  j.Close('}');
}

void SoloLoader(Json& j, uint32_t uid, const Group::Snapshot& g) {
  j.Open('{');
  const Group::Snapshot::MemberRow none;
  const auto& m = g.members.empty() ? none : g.members.front();
  j.Key("session").U(m.session);
  j.Key("pid").I(m.info.pid);
  j.Key("uid").U(uid);
  j.Key("batch_size").U(g.batch_size);
  j.Key("cursor").U(m.cursor);
  Held(j, g);
  j.Close('}');
}

}  // namespace

bool MaySee(uint32_t viewer, uint32_t owner) {
  return viewer == owner || viewer == 0 || viewer == ::geteuid();
}

std::string BuildStatusJson(const StatusInput& in, uint32_t viewer) {
  Json j;
  j.Open('{');
  j.Key("daemon").Open('{');
  j.Key("pid").I(in.pid);
  j.Key("version").S(LOADERX_DAEMON_VERSION);
  j.Key("protocol").S(std::to_string(kProtocolMajor) + "." + std::to_string(kProtocolMinor));
  j.Key("uptime_s").D(in.uptime_s);
  j.Key("incarnation").U(in.incarnation);
  j.Key("socket").S(in.socket_path);
  j.Key("viewer_uid").U(viewer);
  j.Key("sees_all_uids").B(viewer == 0 || viewer == ::geteuid());
  if (in.config != nullptr) {
    const Config& c = *in.config;
    j.Key("limits").Open('{');
    j.Key("memory_limit").U(c.memory_limit);
    j.Key("memory_per_uid").U(c.memory_per_uid);
    j.Key("sessions_per_uid").U(c.sessions_per_uid);
    j.Key("max_leases").U(c.max_leases);
    j.Key("max_prefetch").U(c.max_prefetch);
    j.Key("max_skew").U(c.max_skew);
    j.Key("group_prefetch").U(c.group_prefetch);
    j.Key("group_live_batches").U(c.group_live_batches);
    j.Key("group_timeout_s").D(std::chrono::duration<double>(c.group_timeout).count());
    j.Key("threads").U(c.threads);
    j.Close('}');
  }
  j.Close('}');
  // Room for the closing lists and uids: a group that would not fit is left out.
  const size_t budget = kMaxStatusBytes - 16 * 1024;
  bool truncated = false;
  j.Key("named_groups").Open('[');
  for (const auto& g : in.groups) {
    if (g.snapshot.name.empty() || !MaySee(viewer, g.uid)) continue;
    if (j.size() > budget) {
      truncated = true;
      break;
    }
    NamedGroup(j, g.uid, g.snapshot);
  }
  j.Close(']');
  j.Key("solo_loaders").Open('[');
  for (const auto& g : in.groups) {
    if (!g.snapshot.name.empty() || !MaySee(viewer, g.uid)) continue;
    if (j.size() > budget) {
      truncated = true;
      break;
    }
    SoloLoader(j, g.uid, g.snapshot);
  }
  j.Close(']');
  j.Key("uids").Open('[');
  for (const auto& u : in.uids) {
    if (!MaySee(viewer, u.uid) || (u.sessions == 0 && u.ring_bytes == 0)) continue;
    if (j.size() > kMaxStatusBytes - 1024) {
      truncated = true;
      break;
    }
    j.Open('{');
    j.Key("uid").U(u.uid);
    j.Key("sessions").U(u.sessions);
    j.Key("ring_bytes").U(u.ring_bytes);
    j.Close('}');
  }
  j.Close(']');
  j.Key("truncated").B(truncated);
  j.Close('}');
  return std::move(j.str());
}

}  // namespace loaderx::daemon
