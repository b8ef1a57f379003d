#include "format.h"

#include <cstdio>
#include <msgpack.hpp>

#include "xxh.h"

namespace loaderx::format {

std::string DataFileName(uint32_t shard) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "data-%03u", shard);
  return buf;
}

uint64_t Hash64(const void* data, size_t len) { return XXH3_64bits(data, len); }

const char* LayoutName(Layout l) {
  switch (l) {
    case Layout::kEntries:
      return "entries";
    case Layout::kComputed:
      return "computed";
    case Layout::kEnds:
      return "ends";
    case Layout::kGroups:
      return "groups";
  }
  return "?";
}

namespace {

const char* KindName(Kind k) { return k == Kind::kDense ? "dense" : "ragged"; }

using Packer = msgpack::packer<msgpack::sbuffer>;

void PackStr(Packer& p, std::string_view s) {
  p.pack_str(static_cast<uint32_t>(s.size()));
  p.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

}  // namespace

std::string EncodeMetadata(const Metadata& m) {
  msgpack::sbuffer buf;
  Packer p(buf);
  const bool v11 = m.layout != Layout::kEntries;
  const bool groups = m.layout == Layout::kGroups;
  p.pack_map(v11 ? (groups ? 24 : 22) : 17);
  PackStr(p, "magic");
  PackStr(p, kMagic);
  PackStr(p, "major");
  p.pack(m.major);
  PackStr(p, "minor");
  p.pack(m.minor);
  PackStr(p, "kind");
  PackStr(p, KindName(m.schema.kind));
  PackStr(p, "dtype");
  PackStr(p, m.schema.dtype.str);
  PackStr(p, "item_shape");
  p.pack_array(static_cast<uint32_t>(m.schema.item_shape.size()));
  for (uint64_t d : m.schema.item_shape) p.pack(d);
  PackStr(p, "ndim");
  p.pack(m.schema.ndim);
  PackStr(p, "codec");
  PackStr(p, CodecName(m.codec));
  PackStr(p, "level");
  p.pack(m.level);
  PackStr(p, "count");
  p.pack(m.count);
  PackStr(p, "data_shards");
  p.pack(m.data_shards);
  PackStr(p, "dict_id");
  p.pack(m.dict_id);
  PackStr(p, "nbytes");
  p.pack(m.nbytes);
  PackStr(p, "index_table_xxh3");
  p.pack(m.index_table_xxh3);
  PackStr(p, "shapes_table_xxh3");
  p.pack(m.shapes_table_xxh3);
  PackStr(p, "files");
  p.pack_map(static_cast<uint32_t>(m.files.size()));
  for (const auto& [name, info] : m.files) {
    PackStr(p, name);
    p.pack_array(2);
    p.pack(info.size);
    p.pack(info.xxh3);
  }
  PackStr(p, "writer");
  PackStr(p, m.writer);
  if (v11) {
    PackStr(p, "layout");
    PackStr(p, LayoutName(m.layout));
    PackStr(p, "run_records");
    p.pack(m.run_records);
    PackStr(p, "data_block");
    p.pack(m.data_block);
    PackStr(p, "sums_xxh3");
    p.pack(m.sums_table_xxh3);
    PackStr(p, "metadata");
    PackStr(p, m.user_metadata);
  }
  if (groups) {
    PackStr(p, "wide_ends");
    p.pack(m.wide_ends);
    PackStr(p, "wide_xxh3");
    p.pack(m.wide_xxh3);
  }

  std::string out(buf.data(), buf.size());
  uint64_t h = Hash64(out.data(), out.size());
  out.append(reinterpret_cast<const char*>(&h), 8);
  return out;
}

namespace {

// The text fields of the metadata map, resolved once the whole map is read.
struct MetaText {
  bool seen_magic = false;
  std::string kind, dtype, codec, layout;
};

Status Bad(const std::string& label, const std::string& why) {
  return Status::Corruption(label + ": " + why);
}

// Decodes one key of the metadata map into *m (text fields into *t).
// Unknown keys (added by a newer minor version) are ignored. Throws msgpack's
// exception for a value of the wrong type.
Status DecodeField(const std::string& key, const msgpack::object& v, const std::string& label,
                   Metadata* m, MetaText* t) {
  if (key == "magic") {
    if (v.as<std::string>() != kMagic) return Bad(label, "not a Zrecord store (bad magic)");
    t->seen_magic = true;
  } else if (key == "major") {
    m->major = v.as<uint32_t>();
  } else if (key == "minor") {
    m->minor = v.as<uint32_t>();
  } else if (key == "kind") {
    t->kind = v.as<std::string>();
  } else if (key == "dtype") {
    t->dtype = v.as<std::string>();
  } else if (key == "item_shape") {
    m->schema.item_shape = v.as<std::vector<uint64_t>>();
  } else if (key == "ndim") {
    m->schema.ndim = v.as<uint32_t>();
  } else if (key == "codec") {
    t->codec = v.as<std::string>();
  } else if (key == "level") {
    m->level = v.as<int>();
  } else if (key == "count") {
    m->count = v.as<uint64_t>();
  } else if (key == "data_shards") {
    m->data_shards = v.as<uint32_t>();
  } else if (key == "dict_id") {
    m->dict_id = v.as<uint32_t>();
  } else if (key == "nbytes") {
    m->nbytes = v.as<uint64_t>();
  } else if (key == "index_table_xxh3") {
    m->index_table_xxh3 = v.as<uint64_t>();
  } else if (key == "shapes_table_xxh3") {
    m->shapes_table_xxh3 = v.as<uint64_t>();
  } else if (key == "files") {
    if (v.type != msgpack::type::MAP) return Bad(label, "'files' is not a map");
    for (uint32_t j = 0; j < v.via.map.size; ++j) {
      auto pair = v.via.map.ptr[j].val.as<std::vector<uint64_t>>();
      if (pair.size() != 2) return Bad(label, "bad 'files' entry");
      m->files[v.via.map.ptr[j].key.as<std::string>()] = FileInfo{pair[0], pair[1]};
    }
  } else if (key == "writer") {
    m->writer = v.as<std::string>();
  } else if (key == "layout") {
    t->layout = v.as<std::string>();
  } else if (key == "run_records") {
    m->run_records = v.as<uint64_t>();
  } else if (key == "data_block") {
    m->data_block = v.as<uint64_t>();
  } else if (key == "sums_xxh3") {
    m->sums_table_xxh3 = v.as<uint64_t>();
  } else if (key == "metadata") {
    m->user_metadata = v.as<std::string>();
  } else if (key == "wide_ends") {
    m->wide_ends = v.as<uint64_t>();
  } else if (key == "wide_xxh3") {
    m->wide_xxh3 = v.as<uint64_t>();
  }
  return Status::OK();
}

// The msgpack map in bytes[0, body), every key decoded (DecodeField).
Status DecodeMap(std::string_view bytes, size_t body, const std::string& label, Metadata* m,
                 MetaText* t) {
  try {
    size_t off = 0;
    msgpack::object_handle oh = msgpack::unpack(bytes.data(), body, off);
    if (off != body) return Bad(label, "trailing bytes after metadata");
    const msgpack::object& o = oh.get();
    if (o.type != msgpack::type::MAP) return Bad(label, "metadata is not a map");
    for (uint32_t i = 0; i < o.via.map.size; ++i) {
      const auto& kv = o.via.map.ptr[i];
      LX_RETURN_IF_ERROR(DecodeField(kv.key.as<std::string>(), kv.val, label, m, t));
    }
  } catch (const std::exception& e) {
    return Bad(label, std::string("malformed metadata: ") + e.what());
  }
  return Status::OK();
}

// The format version, then the schema and codec from `t`, checked.
Status DecodeSchema(const MetaText& t, const std::string& label, Metadata* m) {
  if (!t.seen_magic) return Bad(label, "not a Zrecord store (no magic)");
  if (m->major != kFormatMajor || m->minor > kFormatMinor) {
    // A newer minor may store records this reader would decode wrongly
    // (1.2: narrowed integers), so it is refused like another major.
    return Bad(label, "unsupported format version " + std::to_string(m->major) + "." +
                          std::to_string(m->minor) + " (this reader supports " +
                          std::to_string(kFormatMajor) + ".0 to " + std::to_string(kFormatMajor) +
                          "." + std::to_string(kFormatMinor) + ")");
  }
  if (t.kind == "dense") {
    m->schema.kind = Kind::kDense;
  } else if (t.kind == "ragged") {
    m->schema.kind = Kind::kRagged;
  } else {
    return Bad(label, "unknown kind '" + t.kind + "'");
  }
  auto dt = DType::Parse(t.dtype);
  if (!dt.ok()) return Bad(label, "bad dtype: " + dt.status().message());
  m->schema.dtype = *dt;
  auto c = ParseCodec(t.codec);
  if (!c.ok()) return Bad(label, c.status().message());
  m->codec = *c;
  if (m->data_shards < 1 || m->data_shards > kMaxShards) {
    return Bad(label, "data_shards " + std::to_string(m->data_shards) + " outside 1..255");
  }
  if (m->schema.kind == Kind::kDense) {
    if (m->schema.item_shape.size() > kMaxDenseItemNdim) {
      return Bad(label, "item_shape rank above 63");
    }
    m->schema.ndim = static_cast<uint32_t>(m->schema.item_shape.size());
    uint64_t bytes_per = m->schema.dtype.itemsize;
    for (uint64_t d : m->schema.item_shape) {
      if (MulOverflow(bytes_per, d, &bytes_per)) return Bad(label, "item_shape overflows");
    }
  } else if (m->schema.ndim < 1 || m->schema.ndim > kMaxNdim || !m->schema.item_shape.empty()) {
    return Bad(label, "ragged ndim " + std::to_string(m->schema.ndim) + " outside 1..64");
  }
  if ((m->codec == Codec::kZstdDict) != (m->dict_id != 0)) {
    return Bad(label, "dict_id inconsistent with codec");
  }
  return Status::OK();
}

// The layout named `layout` and its parameters, checked.
Status DecodeLayout(const std::string& layout, const std::string& label, Metadata* m) {
  if (layout.empty() || layout == "entries") {
    m->layout = Layout::kEntries;
  } else if (layout == "computed") {
    m->layout = Layout::kComputed;
  } else if (layout == "ends") {
    m->layout = Layout::kEnds;
  } else if (layout == "groups") {
    m->layout = Layout::kGroups;
  } else {
    return Bad(label, "unknown layout '" + layout + "'");
  }
  if (m->layout != Layout::kEntries) {
    if (m->run_records < 1 || m->run_records > (uint64_t{1} << 40)) {
      return Bad(label, "run_records " + std::to_string(m->run_records) + " outside 1..2^40");
    }
    if (m->data_block < 4096 || m->data_block > (uint64_t{1} << 30)) {
      return Bad(label, "data_block " + std::to_string(m->data_block) + " outside 4096..2^30");
    }
    if (m->layout == Layout::kComputed &&
        (m->schema.kind != Kind::kDense || m->codec != Codec::kRaw)) {
      return Bad(label, "layout 'computed' is for dense raw stores only");
    }
    if (m->layout == Layout::kGroups) {
      if (m->minor < kGroupsMinor) {
        return Bad(label, "layout 'groups' in a format 1." + std::to_string(m->minor) + " store");
      }
      if (m->codec == Codec::kRaw) return Bad(label, "layout 'groups' in a raw store");
      if (m->run_records % kGroupRecords != 0) {
        return Bad(label, "run_records " + std::to_string(m->run_records) +
                              " is not a multiple of " + std::to_string(kGroupRecords) +
                              " (layout 'groups')");
      }
      if (m->wide_ends > m->count) {
        return Bad(label, "wide_ends " + std::to_string(m->wide_ends) + " above the record count");
      }
    }
  }
  return Status::OK();
}

}  // namespace

Result<Metadata> DecodeMetadata(std::string_view bytes, const std::string& label) {
  if (bytes.size() < 9) {
    return Bad(label, "metadata truncated (" + std::to_string(bytes.size()) + " bytes)");
  }
  const size_t body = bytes.size() - 8;
  uint64_t stored;
  std::memcpy(&stored, bytes.data() + body, 8);
  if (Hash64(bytes.data(), body) != stored) return Bad(label, "metadata checksum mismatch");
  Metadata m;
  MetaText t;
  LX_RETURN_IF_ERROR(DecodeMap(bytes, body, label, &m, &t));
  LX_RETURN_IF_ERROR(DecodeSchema(t, label, &m));
  LX_RETURN_IF_ERROR(DecodeLayout(t.layout, label, &m));
  return m;
}

}  // namespace loaderx::format
