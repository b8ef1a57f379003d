// Weighted mixing as virtual stores. Contract: common/include/loaderx/mix.h.
#include "loaderx/mix.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

namespace loaderx {

namespace {

// Segment starts: starts[k] = count_0 + ... + count_{k-1}; starts[K] = V.
std::vector<uint64_t> Starts(const std::vector<uint64_t>& counts) {
  std::vector<uint64_t> starts(counts.size() + 1, 0);
  for (size_t k = 0; k < counts.size(); ++k) starts[k + 1] = starts[k] + counts[k];
  return starts;
}

// The dataset owning position v. REQUIRES: v < starts.back().
size_t PartOf(const std::vector<uint64_t>& starts, uint64_t v) {
  return static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), v) - starts.begin()) -
         1;
}

Status OutOfRange(uint64_t v, uint64_t total) {
  return Status::IndexError("mixture position " + std::to_string(v) + " out of range [0, " +
                            std::to_string(total) + ")");
}

// What a virtual store reports about itself where a file-backed one names files.
class VirtualStore : public Store {
 public:
  VirtualStore(std::vector<uint64_t> counts, size_t datasets)
      : counts_(std::move(counts)), starts_(Starts(counts_)), datasets_(datasets) {}

  uint64_t size() const override { return starts_.back(); }
  Result<RecordRef> Locate(uint64_t i) const override {
    return Status::InvalidArgument(label() + ": a mixture position has no file of its own");
  }

 protected:
  std::vector<uint64_t> counts_;
  std::vector<uint64_t> starts_;
  size_t datasets_;  // K: entry e of counts_ is dataset e % K
};

class MixedStoreImpl final : public VirtualStore {
 public:
  MixedStoreImpl(std::vector<std::shared_ptr<const Store>> parts, std::vector<uint64_t> counts)
      : VirtualStore(std::move(counts), parts.size()), parts_(std::move(parts)) {
    label_ = "mix(";
    for (size_t k = 0; k < parts_.size(); ++k) {
      label_ += (k ? ", " : "") + parts_[k]->label();
      nbytes_ += parts_[k]->nbytes();
      stored_bytes_ += parts_[k]->stored_bytes();
    }
    label_ += ")";
  }

  const Schema& schema() const override { return parts_[0]->schema(); }
  Codec codec() const override { return parts_[0]->codec(); }
  uint32_t data_shards() const override { return parts_[0]->data_shards(); }
  // Of the distinct records of every part (a position repeats a record).
  uint64_t nbytes() const override { return nbytes_; }
  uint64_t stored_bytes() const override { return stored_bytes_; }
  const std::string& label() const override { return label_; }

  Status RecordShape(uint64_t v, uint64_t* dims) const override {
    LX_ASSIGN_OR_RETURN(auto at, Map(v));
    return parts_[at.first]->RecordShape(at.second, dims);
  }
  Result<uint64_t> RecordBytes(uint64_t v) const override {
    LX_ASSIGN_OR_RETURN(auto at, Map(v));
    return parts_[at.first]->RecordBytes(at.second);
  }
  Status ReadRecord(uint64_t v, void* out, uint64_t out_len) const override {
    LX_ASSIGN_OR_RETURN(auto at, Map(v));
    return parts_[at.first]->ReadRecord(at.second, out, out_len);
  }

  // Splits the batch by dataset and gathers each part's records with its own
  // store (which spreads them over `pool`), one part after the other.
  Status Gather(std::span<const uint64_t> indices, std::span<void* const> outs,
                ThreadPool* pool) const override {
    if (indices.size() != outs.size()) {
      return Status::InvalidArgument("gather: indices and outputs differ in length");
    }
    std::vector<std::vector<uint64_t>> local(parts_.size());
    std::vector<std::vector<void*>> dest(parts_.size());
    for (size_t j = 0; j < indices.size(); ++j) {
      LX_ASSIGN_OR_RETURN(auto at, Map(indices[j]));
      local[at.first].push_back(at.second);
      dest[at.first].push_back(outs[j]);
    }
    for (size_t k = 0; k < parts_.size(); ++k) {
      if (local[k].empty()) continue;
      LX_RETURN_IF_ERROR(parts_[k]->Gather(local[k], dest[k], pool));
    }
    return Status::OK();
  }

  Status Verify(const std::function<void(uint64_t, uint64_t)>& progress) const override {
    uint64_t total = 0;
    for (const auto& p : parts_) total += p->size();
    uint64_t base = 0;
    for (const auto& p : parts_) {
      LX_RETURN_IF_ERROR(p->Verify([&](uint64_t done, uint64_t) {
        if (progress) progress(base + done, total);
      }));
      base += p->size();
    }
    return Status::OK();
  }

 private:
  // (part, record) of position v.
  Result<std::pair<size_t, uint64_t>> Map(uint64_t v) const {
    if (v >= size()) return OutOfRange(v, size());
    const size_t e = PartOf(starts_, v);
    const size_t k = e % datasets_;
    return std::pair<size_t, uint64_t>{k, (v - starts_[e]) % parts_[k]->size()};
  }

  std::vector<std::shared_ptr<const Store>> parts_;
  std::string label_;
  uint64_t nbytes_ = 0;
  uint64_t stored_bytes_ = 0;
};

class MixSourceStoreImpl final : public VirtualStore {
 public:
  MixSourceStoreImpl(std::vector<uint64_t> counts, size_t datasets)
      : VirtualStore(std::move(counts), datasets) {
    schema_.kind = Kind::kDense;
    schema_.dtype = DType::Parse("<i8").value();
    schema_.ndim = 0;
    label_ = "mix-source(" + std::to_string(datasets_) + " datasets)";
  }

  const Schema& schema() const override { return schema_; }
  Codec codec() const override { return Codec::kRaw; }
  uint32_t data_shards() const override { return 1; }
  uint64_t nbytes() const override { return 8 * datasets_; }
  uint64_t stored_bytes() const override { return 0; }
  const std::string& label() const override { return label_; }

  Status RecordShape(uint64_t v, uint64_t* dims) const override {
    return v < size() ? Status::OK() : OutOfRange(v, size());
  }
  Result<uint64_t> RecordBytes(uint64_t v) const override {
    if (v >= size()) return OutOfRange(v, size());
    return uint64_t{8};
  }
  Status ReadRecord(uint64_t v, void* out, uint64_t out_len) const override {
    if (v >= size()) return OutOfRange(v, size());
    if (out_len != 8) return Status::InvalidArgument(label_ + ": a record is 8 bytes");
    const int64_t k = static_cast<int64_t>(PartOf(starts_, v) % datasets_);
    std::memcpy(out, &k, sizeof k);
    return Status::OK();
  }
  Status Gather(std::span<const uint64_t> indices, std::span<void* const> outs,
                ThreadPool* pool) const override {
    if (indices.size() != outs.size()) {
      return Status::InvalidArgument("gather: indices and outputs differ in length");
    }
    for (size_t j = 0; j < indices.size(); ++j) {
      LX_RETURN_IF_ERROR(ReadRecord(indices[j], outs[j], 8));
    }
    return Status::OK();
  }
  Status Verify(const std::function<void(uint64_t, uint64_t)>& progress) const override {
    return Status::OK();  // nothing stored, nothing to check
  }

 private:
  Schema schema_;
  std::string label_;
};

}  // namespace

Status ValidateMixCounts(const std::vector<uint64_t>& counts, size_t datasets) {
  const size_t k_count = datasets == 0 ? counts.size() : datasets;
  if (k_count == 0 || k_count > kMaxMixParts) {
    return Status::InvalidArgument("a mixture needs 1.." + std::to_string(kMaxMixParts) +
                                   " datasets, got " + std::to_string(k_count));
  }
  if (counts.empty() || counts.size() % k_count != 0 || counts.size() / k_count > kMaxMixSegments) {
    return Status::InvalidArgument(
        "a mixture schedule needs 1.." + std::to_string(kMaxMixSegments) + " segments of " +
        std::to_string(k_count) + " counts, got " + std::to_string(counts.size()) + " counts");
  }
  const size_t segments = counts.size() / k_count;
  uint64_t total = 0;
  for (size_t k = 0; k < k_count; ++k) {
    bool some = false;
    for (size_t s = 0; s < segments; ++s) some = some || counts[s * k_count + k] != 0;
    if (!some) {
      return Status::InvalidArgument("mixture dataset " + std::to_string(k) + " has 0 positions");
    }
  }
  for (size_t s = 0; s < segments; ++s) {
    uint64_t segment = 0;
    for (size_t k = 0; k < k_count; ++k) {
      const uint64_t c = counts[s * k_count + k];
      if (segments == 1 && c == 0) {
        return Status::InvalidArgument("mixture dataset " + std::to_string(k) + " has 0 positions");
      }
      segment += c;
      if (__builtin_add_overflow(total, c, &total) || total >= (uint64_t{1} << 63)) {
        return Status::InvalidArgument("mixture positions must add up to less than 2^63");
      }
    }
    if (segment == 0) {
      return Status::InvalidArgument("mixture schedule segment " + std::to_string(s) +
                                     " has 0 positions");
    }
  }
  return Status::OK();
}

Result<std::shared_ptr<Store>> MixedStore(std::vector<std::shared_ptr<const Store>> parts,
                                          std::vector<uint64_t> counts, size_t segments) {
  if (parts.empty() || segments == 0 || counts.size() / segments != parts.size() ||
      counts.size() % segments != 0) {
    return Status::InvalidArgument(
        "a mixture needs one store per dataset and segment: " + std::to_string(parts.size()) +
        " stores, " + std::to_string(counts.size()) + " counts, " + std::to_string(segments) +
        " segment(s)");
  }
  LX_RETURN_IF_ERROR(ValidateMixCounts(counts, parts.size()));
  for (size_t k = 0; k < parts.size(); ++k) {
    if (parts[k] == nullptr) {
      return Status::InvalidArgument("mixture store " + std::to_string(k) + " is null");
    }
    if (parts[k]->size() == 0) {
      return Status::InvalidArgument(parts[k]->label() + ": an empty store cannot be mixed");
    }
    const Schema& a = parts[0]->schema();
    const Schema& b = parts[k]->schema();
    const bool same = a.kind == b.kind && a.dtype == b.dtype &&
                      (a.kind == Kind::kDense ? a.item_shape == b.item_shape : a.ndim == b.ndim);
    if (!same) {
      return Status::SchemaError(parts[k]->label() + " does not match " + parts[0]->label() +
                                 ": mixed stores need one kind, dtype and item shape (or rank)");
    }
  }
  return std::shared_ptr<Store>(
      std::make_shared<MixedStoreImpl>(std::move(parts), std::move(counts)));
}

Result<std::shared_ptr<Store>> MixSourceStore(std::vector<uint64_t> counts, size_t datasets) {
  LX_RETURN_IF_ERROR(ValidateMixCounts(counts, datasets));
  const size_t k_count = datasets == 0 ? counts.size() : datasets;
  return std::shared_ptr<Store>(std::make_shared<MixSourceStoreImpl>(std::move(counts), k_count));
}

}  // namespace loaderx
