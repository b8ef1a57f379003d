// Groups of loaderxd loaders (protocol 1.1, docs/daemon.md "Groups"): the
// values a client names when it joins or creates a group. Public because
// client::LoaderSpec carries them; the wire protocol (internal wire.h)
// spells them on the wire as the names GroupModeName/GroupJoinName return.
//
// Thread-safety: constants and pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace loaderx {

// Longest group name (bytes); a longer one is InvalidArgument at open.
inline constexpr uint32_t kMaxGroupName = 256;

// How members of a group share its batches. On the wire: "shard" | "broadcast".
enum class GroupMode : uint32_t {
  kShard = 0,      // members are ranks; each receives its slice of a global batch
  kBroadcast = 1,  // every member receives the same full batches
};
// Where a joining member starts. On the wire: absent | "start_step" | "current".
enum class GroupJoin : uint32_t {
  kDefault = 0,    // shard: kStartStep, broadcast: kCurrent
  kStartStep = 1,  // at the member's own start_step
  kCurrent = 2,    // at the group's current (oldest held) step
};
// "shard" / "broadcast"; "start_step" / "current" ("default" for kDefault).
const char* GroupModeName(GroupMode mode);
const char* GroupJoinName(GroupJoin join);
// Their inverses: the mode or join a name spells, nullopt for any other
// string (kDefault has no name: it is the join's absence).
std::optional<GroupMode> ParseGroupMode(std::string_view name);
std::optional<GroupJoin> ParseGroupJoin(std::string_view name);

}  // namespace loaderx
