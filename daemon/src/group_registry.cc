#include "group_registry.h"

namespace loaderx::daemon {

std::shared_ptr<Group> GroupRegistry::Find(uint32_t uid, const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = named_.find({uid, name});
  return it == named_.end() ? nullptr : it->second;
}

Result<GroupRegistry::Joined> GroupRegistry::Join(const Joiner& who, const Group::MemberSpec& spec,
                                                  const Maker& make) {
  const bool named = !who.name.empty();
  const auto key = std::make_pair(who.uid, who.name);
  Joined out;
  // A solo loader's group is nobody else's: only a named one is created
  // under the lock (so two opens of one name make one group).
  std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
  if (named) {
    lock.lock();
    auto it = named_.find(key);
    if (it != named_.end()) out.group = it->second;
  }
  if (out.group) {
    LX_RETURN_IF_ERROR(out.group->CheckCompatible(spec));
  } else {
    LX_ASSIGN_OR_RETURN(out.group, make());
    out.created = true;
    if (named) {
      named_.emplace(key, out.group);
      ++counts_.groups;
    }
  }
  Result<uint64_t> joined = out.group->Join(who.session, who.info, who.join, who.start_step);
  if (!joined.ok()) {
    if (!out.created) return joined.status();
    if (named) {  // never left behind without members
      named_.erase(key);
      --counts_.groups;
    }
    if (lock.owns_lock()) lock.unlock();
    out.group->Close();
    return joined.status();
  }
  out.first_step = *joined;
  if (!lock.owns_lock()) lock.lock();
  if (!named) solo_[who.session] = {who.uid, out.group};
  ++counts_.loaders;
  if (named) ++counts_.group_members;
  return out;
}

bool GroupRegistry::Leave(uint32_t uid, uint64_t session, const std::shared_ptr<Group>& group,
                          const std::string& how) {
  const bool named = !group->name().empty();
  bool last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last = group->Leave(session, how);
    if (named) {
      auto it = named_.find({uid, group->name()});
      if (last && it != named_.end() && it->second == group) named_.erase(it);
      if (last) --counts_.groups;
      --counts_.group_members;
    } else {
      solo_.erase(session);
    }
    --counts_.loaders;
  }
  // Outside the lock: closing stops the pipeline.
  if (last) group->Close();
  return last;
}

std::vector<std::pair<uint32_t, std::shared_ptr<Group>>> GroupRegistry::All() const {
  std::vector<std::pair<uint32_t, std::shared_ptr<Group>>> all;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [key, g] : named_) all.emplace_back(key.first, g);
  for (const auto& [session, owned] : solo_) {
    if (auto g = owned.second.lock()) all.emplace_back(owned.first, std::move(g));
  }
  return all;
}

GroupRegistry::Counts GroupRegistry::counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counts_;
}

}  // namespace loaderx::daemon
