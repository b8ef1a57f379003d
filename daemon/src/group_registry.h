// GroupRegistry: the groups of loaderxd's open loaders (serving_group.h), found by
// the sessions that join and leave them.
//
// Named groups are keyed by (uid, name): groups never span users, and every
// connection of one uid that names a group with the same spec joins the same
// one. A solo loader's group is private to its session: it is never found by
// an open, only listed (by session) for the status document. The registry
// also counts, for stats, the loaders open (members of any group), the named
// groups and their members.
//
// A named group is listed from the open that creates it until its last
// member leaves; both happen under the registry's lock, so an open never
// joins a group that is about to close (it finds no entry and creates a
// fresh group instead).
//
// Thread-safety: all methods are thread-safe (one mutex; Group::Create and
// Group::Close run outside it, except the creation of a named group).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "loaderx/status.h"
#include "serving_group.h"

namespace loaderx::daemon {

class GroupRegistry {
 public:
  struct Counts {
    uint64_t loaders = 0;        // members of any group
    uint64_t groups = 0;         // named groups
    uint64_t group_members = 0;  // members of named groups
  };
  // Who joins and how (Group::Join's arguments).
  struct Joiner {
    uint32_t uid = 0;
    uint64_t session = 0;
    std::string name;  // "" for a solo loader
    Group::MemberInfo info;
    GroupJoin join = GroupJoin::kCurrent;
    uint64_t start_step = 0;
  };
  struct Joined {
    std::shared_ptr<Group> group;
    bool created = false;     // `make` created it
    uint64_t first_step = 0;  // the member's first step
  };
  using Maker = std::function<Result<std::shared_ptr<Group>>()>;

  // The named group (uid, name), or null.
  std::shared_ptr<Group> Find(uint32_t uid, const std::string& name) const;
  // Joins `who` to the named group (who.uid, who.name) if there is one and
  // `spec` is compatible with it (else its InvalidArgument), or to a new
  // group from `make` (a solo loader's always). A group made here is never
  // left behind without members: if the join fails it is closed and
  // forgotten (and its ring's charge goes with the ring, accounts.h).
  // Errors are CheckCompatible's, `make`'s or Group::Join's.
  Result<Joined> Join(const Joiner& who, const Group::MemberSpec& spec, const Maker& make);
  // Member `session` of `uid` leaves `group` (`how`: Group::Leave's). True
  // if it was the last one: the group is then forgotten and closed
  // (Group::Close).
  bool Leave(uint32_t uid, uint64_t session, const std::shared_ptr<Group>& group,
             const std::string& how = "");

  // Every group with the uid that owns it: named groups, then solo loaders.
  std::vector<std::pair<uint32_t, std::shared_ptr<Group>>> All() const;
  Counts counts() const;

 private:
  mutable std::mutex mu_;
  // Guarded by mu_.
  std::map<std::pair<uint32_t, std::string>, std::shared_ptr<Group>> named_;
  // Solo loaders' groups by session, with their uid (status only).
  std::map<uint64_t, std::pair<uint32_t, std::weak_ptr<Group>>> solo_;
  Counts counts_;
};

}  // namespace loaderx::daemon
