#include "parallel/zero/plan.h"

#include <numeric>
#include <unordered_map>
#include <unordered_set>

#include "core/errors.h"

namespace krab::parallel::zero {
namespace {

std::string trimmed(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

std::vector<std::string> split_path(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t dot = s.find('.'); dot != std::string::npos; dot = s.find('.', start)) {
    out.push_back(s.substr(start, dot - start));
    start = dot + 1;
  }
  out.push_back(s.substr(start));
  return out;
}

// Wildcard match of one path component. Greedy with one backtrack point (the last '*'): a later
// '*' can absorb anything an earlier one would have, so retrying only the last one is complete
// and the match is linear-ish rather than exponential on "a*a*a*b".
bool component_matches(const std::string& glob, const std::string& s) {
  size_t g = 0, i = 0, star = std::string::npos, resume = 0;
  while (i < s.size()) {
    if (g < glob.size() && glob[g] == '*') {
      star = g++;
      resume = i;
    } else if (g < glob.size() && glob[g] == s[i]) {
      ++g;
      ++i;
    } else if (star != std::string::npos) {
      g = star + 1;
      i = ++resume;
    } else {
      return false;
    }
  }
  while (g < glob.size() && glob[g] == '*') ++g;
  return g == glob.size();
}

void check_glob(const std::string& glob) {
  KRAB_CHECK_ARG(!glob.empty(), "parallel.wrap: an empty glob names no module");
  for (const std::string& c : split_path(glob))
    KRAB_CHECK_ARG(!c.empty(), "parallel.wrap: '", glob,
                   "' has an empty path component (module paths are dotted names like "
                   "'blocks.0')");
}

std::string list_candidates(const std::vector<std::string>& candidates) {
  // A GPT has a few dozen module paths per block; the first ones show the naming well enough.
  constexpr size_t kShown = 32;
  if (candidates.empty()) return "(none: the model has no trainable parameter in a submodule)";
  std::string out;
  for (size_t i = 0; i < candidates.size() && i < kShown; ++i)
    out += (i ? ", " : "") + candidates[i];
  if (candidates.size() > kShown) out += str_cat(" ... and ", candidates.size() - kShown, " more");
  return out;
}

// For each candidate, the first glob that picks it, or -1. Refuses a glob that picks nothing.
std::vector<int> match_globs(const std::vector<std::string>& candidates,
                             const std::vector<std::string>& globs) {
  std::vector<int> picked_by(candidates.size(), -1);
  for (size_t g = 0; g < globs.size(); ++g) {
    check_glob(globs[g]);
    bool any = false;
    for (size_t c = 0; c < candidates.size(); ++c) {
      if (!glob_matches(globs[g], candidates[c])) continue;
      any = true;
      if (picked_by[c] < 0) picked_by[c] = static_cast<int>(g);
    }
    KRAB_CHECK_ARG(any, "parallel.wrap: '", globs[g],
                   "' matches no module; the candidates are: ", list_candidates(candidates));
  }
  return picked_by;
}

// Refuses the first (in candidate order) picked unit that lies inside another picked unit.
void refuse_nested(const std::vector<std::string>& candidates, const std::vector<int>& picked_by,
                   const std::vector<std::string>& globs) {
  for (size_t inner = 0; inner < candidates.size(); ++inner) {
    if (picked_by[inner] < 0) continue;
    for (size_t outer = 0; outer < candidates.size(); ++outer) {
      if (picked_by[outer] < 0 || outer == inner) continue;
      const std::string& o = candidates[outer];
      const std::string& i = candidates[inner];
      if (i.size() > o.size() && i.compare(0, o.size(), o) == 0 && i[o.size()] == '.')
        throw InvalidArgument(str_cat("parallel.wrap: '", i, "' (from '", globs[picked_by[inner]],
                                      "') is inside unit '", o, "' (from '",
                                      globs[picked_by[outer]], "'); units may not nest"));
    }
  }
}

}  // namespace

bool glob_matches(const std::string& glob, const std::string& path) {
  const std::vector<std::string> g = split_path(glob);
  const std::vector<std::string> p = split_path(path);
  if (g.size() != p.size()) return false;
  for (size_t i = 0; i < g.size(); ++i)
    if (!component_matches(g[i], p[i])) return false;
  return true;
}

std::vector<std::string> module_paths(const std::vector<engine::ParamShape>& params) {
  std::vector<std::string> out;
  std::unordered_set<std::string> seen;
  for (const engine::ParamShape& p : params) {
    for (size_t dot = p.name.find('.'); dot != std::string::npos; dot = p.name.find('.', dot + 1)) {
      std::string prefix = p.name.substr(0, dot);
      if (seen.insert(prefix).second) out.push_back(std::move(prefix));
    }
  }
  return out;
}

std::vector<engine::UnitParams> plan_units(const std::vector<engine::ParamShape>& params,
                                           const std::vector<std::string>& candidates,
                                           const std::vector<std::string>& globs) {
  const std::vector<int> picked_by = match_globs(candidates, globs);
  refuse_nested(candidates, picked_by, globs);

  std::vector<engine::UnitParams> units(1);  // units[0]: the root, name ""
  std::unordered_map<std::string, size_t> unit_of_path;
  for (size_t c = 0; c < candidates.size(); ++c) {
    if (picked_by[c] < 0 || unit_of_path.count(candidates[c])) continue;
    unit_of_path.emplace(candidates[c], units.size());
    units.push_back(engine::UnitParams{candidates[c], {}});
  }
  std::unordered_set<std::string> names;
  for (const engine::ParamShape& p : params) {
    KRAB_CHECK_ARG(names.insert(p.name).second, "parallel.wrap: parameter '", p.name,
                   "' is listed twice");
    // Units do not nest, so at most one prefix of the name is a unit.
    size_t unit = 0;
    for (size_t dot = p.name.find('.'); dot != std::string::npos && unit == 0;
         dot = p.name.find('.', dot + 1)) {
      auto it = unit_of_path.find(p.name.substr(0, dot));
      if (it != unit_of_path.end()) unit = it->second;
    }
    units[unit].params.push_back(p);
  }
  return units;
}

std::vector<std::string> wrap_globs(const std::string& text) {
  std::vector<std::string> globs;
  size_t pos = 0;
  while (true) {
    const size_t comma = text.find(',', pos);
    const std::string item = trimmed(text.substr(pos, comma - pos));
    KRAB_CHECK_ARG(!item.empty(), "parallel.wrap: '", text,
                   "' has an empty item (write auto or a list of module-path globs)");
    globs.push_back(item);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return globs;
}

std::vector<engine::UnitParams> plan_wrap(const std::vector<engine::ParamShape>& params,
                                          const std::vector<std::string>& model_candidates,
                                          const std::string& text) {
  if (trimmed(text) != "auto") return plan_units(params, module_paths(params), wrap_globs(text));
  // Each candidate is a glob matching itself alone: module names hold no '*' and no '.' of
  // their own, so the candidates become the units one for one, in forward order.
  if (!model_candidates.empty()) return plan_units(params, model_candidates, model_candidates);
  const std::vector<std::string> paths = module_paths(params);
  if (paths.empty()) return plan_units(params, {}, {});
  return plan_units(params, paths, {"*"});
}

std::string wrap_source(const std::vector<std::string>& model_candidates, const std::string& text) {
  if (trimmed(text) != "auto") {
    std::string out;
    for (const std::string& g : wrap_globs(text)) out += (out.empty() ? "" : ", ") + g;
    return out;
  }
  return model_candidates.empty() ? "auto: *, the model offers no units"
                                  : "auto: the model's units";
}

int64_t shard_alignment(int64_t codec_chunk) {
  KRAB_CHECK_ARG(codec_chunk >= 1, "shard alignment: codec chunk must be >= 1, got ", codec_chunk);
  return std::lcm(int64_t{16}, codec_chunk);
}

}  // namespace krab::parallel::zero
