#include "train/manifest.h"

#include <cstdio>
#include <filesystem>
#include <sstream>

#include "core/errors.h"
#include "core/printable.h"
#include "train/optimizer_state.h"

namespace krab::train {
namespace {

std::string unit_key(int u, const char* field) { return str_cat("layout.unit.", u, ".", field); }
std::string shard_key(int r, const char* field) { return str_cat("shard.", r, ".", field); }

std::string shape_text(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

// "name:[2, 3];name:[];" back into names and shapes. The manifest passed its CRC (and seal),
// so a malformed list is a krab bug or a forgery: refused, never guessed at.
}  // namespace

std::vector<engine::ParamShape> parse_param_list(const std::string& text, const std::string& source,
                                                 const std::string& key) {
  std::vector<engine::ParamShape> out;
  std::istringstream in(text);
  std::string item;
  const auto bad = [&] {
    throw CorruptData(
        str_cat(source, ": ", key, " is not a parameter list ('", core::printable(item), "')"));
  };
  while (std::getline(in, item, ';')) {
    const auto colon = item.rfind(':');
    if (colon == std::string::npos || colon == 0 || item.size() < colon + 3 ||
        item[colon + 1] != '[' || item.back() != ']')
      bad();
    engine::ParamShape p{item.substr(0, colon), {}};
    std::istringstream dims(item.substr(colon + 2, item.size() - colon - 3));
    std::string dim;
    while (std::getline(dims, dim, ',')) {
      char* end = nullptr;
      const long long v = std::strtoll(dim.c_str(), &end, 10);
      if (end == dim.c_str() || *end != '\0' || v < 0) bad();
      p.shape.push_back(v);
    }
    out.push_back(std::move(p));
  }
  return out;
}

std::string manifest_path(const std::string& step_dir) {
  return (std::filesystem::path(step_dir) / "manifest.krab").string();
}

std::string shard_path(const std::string& step_dir, int rank, int world) {
  char name[64];
  std::snprintf(name, sizeof(name), "shard-%05d-of-%05d.krab", rank, world);
  return (std::filesystem::path(step_dir) / name).string();
}

void write_manifest(const Manifest& m, core::RecordEntries& out) {
  write_meta(m.meta, out);
  out.add_string("meta.checkpoint_id", m.checkpoint_id);
  out.add_int("zero.stage", m.stage);
  const engine::ShardLayout& l = m.layout;
  out.add_int("layout.world", l.world());
  out.add_int("layout.alignment", l.alignment());
  out.add_int("layout.units", l.num_units());
  for (int u = 0; u < l.num_units(); ++u) {
    std::string params;
    for (const auto& p : l.unit(u).params) params += p.name + ":" + shape_text(p.shape) + ";";
    out.add_string(unit_key(u, "name"), l.unit(u).name);
    out.add_string(unit_key(u, "params"), params);
    out.add_int(unit_key(u, "padded"), l.unit(u).padded);
  }
  out.add_string("optimizer.type", m.optimizer_type);
  out.add_int("optimizer.groups", 1);
  for (const auto& [name, value] : m.optimizer_options)
    out.add_double(str_cat("optimizer.group.0.", name), value);
  for (size_t r = 0; r < m.shards.size(); ++r) {
    out.add_int(shard_key(static_cast<int>(r), "bytes"), static_cast<int64_t>(m.shards[r].bytes));
    out.add_string(shard_key(static_cast<int>(r), "sha256"), m.shards[r].sha256);
  }
}

Manifest read_manifest(const core::Record& in) {
  const std::string& src = in.source();
  Manifest m;
  m.meta = read_meta(in);
  m.checkpoint_id = in.text("meta.checkpoint_id");
  if (m.checkpoint_id.size() != 32 ||
      m.checkpoint_id.find_first_not_of("0123456789abcdef") != std::string::npos)
    throw CorruptData(str_cat(src, ": meta.checkpoint_id '", core::printable(m.checkpoint_id),
                              "' is not 32 hex digits"));
  m.stage = static_cast<int>(in.integer("zero.stage"));
  const int64_t world = in.integer("layout.world"), units = in.integer("layout.units");
  const int64_t alignment = in.integer("layout.alignment");
  if (world < 1 || world > 99999 || units < 1 || units > 100000 || alignment < 1 ||
      alignment > (int64_t{1} << 20))
    throw CorruptData(str_cat(src, ": layout.world ", world, ", layout.units ", units,
                              " or layout.alignment ", alignment, " is out of range"));
  std::vector<engine::UnitParams> plan;
  for (int u = 0; u < units; ++u)
    plan.push_back({in.text(unit_key(u, "name")),
                    parse_param_list(in.text(unit_key(u, "params")), src, unit_key(u, "params"))});
  try {
    m.layout = engine::plan_layout(plan, static_cast<int>(world), alignment);
  } catch (const Error& e) {
    throw CorruptData(str_cat(src, ": its layout cannot be planned: ", core::printable(e.what())));
  }
  for (int u = 0; u < units; ++u)
    if (in.integer(unit_key(u, "padded")) != m.layout.unit(u).padded)
      throw CorruptData(str_cat(src, ": ", unit_key(u, "padded"), " is ",
                                in.integer(unit_key(u, "padded")), ", the layout gives ",
                                m.layout.unit(u).padded));
  m.optimizer_type = in.text("optimizer.type");
  m.optimizer_options = read_group_options(in, m.optimizer_type, 0);
  for (int r = 0; r < world; ++r) {
    const int64_t bytes = in.integer(shard_key(r, "bytes"));
    if (bytes < 0) throw CorruptData(str_cat(src, ": ", shard_key(r, "bytes"), " is ", bytes));
    m.shards.push_back({static_cast<uint64_t>(bytes), in.text(shard_key(r, "sha256"))});
  }
  return m;
}

}  // namespace krab::train
