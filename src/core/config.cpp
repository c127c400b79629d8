// Parsing and validation for the configuration registry (config.h). The keys themselves and
// the docs renderer live in config_keys.cpp.
#include "core/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "core/errors.h"
#include "core/printable.h"

namespace krab::core {
namespace {

// Lookup tables derived from registry(), built once. Building them also checks the registry's
// own invariants, so a bad edit to config_keys.cpp fails on first use rather than producing a
// key that can never be set.
struct Index {
  std::unordered_map<std::string, size_t> key_to_index;
  // Every proper dotted prefix of a key ("train", "train.optimizer") -> its keys, in order.
  std::map<std::string, std::vector<std::string>> sections;
};

const Index& index() {
  static const Index idx = [] {
    Index out;
    const auto& keys = registry();
    for (size_t i = 0; i < keys.size(); ++i) {
      const std::string& key = keys[i].key;
      KRAB_CHECK(!key.empty() && out.key_to_index.emplace(key, i).second, "registry key '", key,
                 "' is empty or duplicated");
      for (size_t dot = key.find('.'); dot != std::string::npos; dot = key.find('.', dot + 1))
        out.sections[key.substr(0, dot)].push_back(key);
    }
    for (const auto& [section, members] : out.sections)
      KRAB_CHECK(!out.key_to_index.count(section), "registry key '", section,
                 "' is also a section of '", members.front(), "'");
    return out;
  }();
  return idx;
}

std::optional<size_t> index_of(const std::string& key) {
  const auto& map = index().key_to_index;
  auto it = map.find(key);
  if (it == map.end()) return std::nullopt;
  return it->second;
}

bool is_section(const std::string& path) { return index().sections.count(path) > 0; }

std::string join(const std::vector<std::string>& items, const char* sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

// Shortest text that parses back to exactly `v` ("0.05", not "0.050000000000000003").
std::string format_float(double v) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, res.ptr);
}

std::string trim(const std::string& s) {
  const char* ws = " \t\r\n";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string last_component(const std::string& key) {
  size_t dot = key.rfind('.');
  return dot == std::string::npos ? key : key.substr(dot + 1);
}

// "unknown key 'x'" plus the most useful hint we can give. A typo ("train.epoch") is caught by
// edit distance; a key put in the wrong place ("train.lr", "lr") by its last component, which
// wins over a typo of more than one edit; failing both, the keys of the section the user was
// aiming at.
std::string unknown_key_message(const std::string& key) {
  std::string msg = "unknown key '" + printable(key) + "'";
  const std::string* closest = nullptr;
  size_t best = 4;  // distances up to 3 count as "close"
  std::vector<std::string> same_leaf;
  for (const KeySpec& spec : registry()) {
    size_t d = edit_distance(key, spec.key);
    if (d < best && d < key.size()) best = d, closest = &spec.key;
    if (last_component(spec.key) == last_component(key)) same_leaf.push_back(spec.key);
  }
  // One key with the very same leaf beats a fuzzy match of two or three edits: "train.lr" is
  // 'train.optimizer.lr' put in the wrong place, not a typo of 'train.loss'.
  if (closest && (best <= 1 || same_leaf.size() != 1))
    return msg + "; did you mean '" + *closest + "'?";
  if (same_leaf.size() == 1) return msg + "; did you mean '" + same_leaf[0] + "'?";
  if (!same_leaf.empty()) return msg + "; did you mean one of '" + join(same_leaf, "', '") + "'?";
  size_t dot = key.rfind('.');
  if (dot != std::string::npos) {
    auto it = index().sections.find(key.substr(0, dot));
    if (it != index().sections.end())
      return msg + "; the keys of '" + it->first + "' are " + join(it->second, ", ");
  }
  return msg + " (docs/config.md lists every key)";
}

// The first tab in the leading whitespace of a line, as (line, column), 1-based.
std::optional<std::pair<size_t, size_t>> first_tab_indent(const std::string& text) {
  size_t line = 1, column = 1;
  bool leading = true;
  for (char c : text) {
    if (c == '\n') {
      ++line;
      column = 1;
      leading = true;
      continue;
    }
    if (leading && c == '\t') return std::make_pair(line, column);
    if (c != ' ') leading = false;
    ++column;
  }
  return std::nullopt;
}

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw InvalidArgument(where + what);
}

using Value = std::variant<int64_t, double, bool, std::string>;

Value parse_int(const KeySpec& spec, const std::string& text, const std::string& where) {
  // from_chars takes no leading '+'; we accept one because YAML and humans both write it.
  std::string_view digits = text;
  if (!digits.empty() && digits[0] == '+') digits.remove_prefix(1);
  bool sign_ok = digits.empty() || (digits[0] != '+' && (digits[0] != '-' || digits == text));
  int64_t v = 0;
  auto res = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (sign_ok && res.ec == std::errc::result_out_of_range)
    fail(where, spec.key + ": '" + printable(text) + "' is out of range for an int");
  if (!sign_ok || digits.empty() || res.ec != std::errc() ||
      res.ptr != digits.data() + digits.size())
    fail(where, spec.key + ": expected an int, got '" + printable(text) + "'");
  return v;
}

Value parse_float(const KeySpec& spec, const std::string& text, const std::string& where) {
  // strtod alone would also take "inf", "nan" and hex floats; a config value is a plain
  // decimal, so screen the characters first.
  bool plain = !text.empty() && text.find_first_not_of("0123456789+-.eE") == std::string::npos;
  char* end = nullptr;
  errno = 0;
  double v = plain ? std::strtod(text.c_str(), &end) : 0.0;
  if (!plain || end != text.c_str() + text.size())
    fail(where, spec.key + ": expected a float, got '" + printable(text) + "'");
  if (errno == ERANGE && !std::isfinite(v))
    fail(where, spec.key + ": '" + printable(text) + "' is out of range for a float");
  return v;
}

Value parse_bool(const KeySpec& spec, const std::string& text, const std::string& where) {
  static const std::unordered_map<std::string, bool> kWords = {
      {"true", true},   {"True", true},   {"TRUE", true}, {"yes", true}, {"Yes", true},
      {"YES", true},    {"on", true},     {"On", true},   {"ON", true},  {"false", false},
      {"False", false}, {"FALSE", false}, {"no", false},  {"No", false}, {"NO", false},
      {"off", false},   {"Off", false},   {"OFF", false}};
  auto it = kWords.find(text);
  if (it == kWords.end())
    fail(where, spec.key + ": expected a bool (true/false, yes/no, on/off), got '" +
                    printable(text) + "'");
  return it->second;
}

// YAML text is UTF-8, but yaml-cpp passes any bytes through. A string that is not UTF-8 would
// not survive to_yaml() (the emitter replaces the bad bytes with U+FFFD, so a federated client
// would get another value than the server has) nor the JSON report, so it is refused here, but
// for paths: Linux allows any bytes in a file name, no path key travels to a client
// (federated/server_job.cpp), the report writes them as U+FFFD (core::dump_json), and
// to_yaml() writes them as !!binary, which parse() reads back to the same bytes.
bool valid_utf8(const std::string& s) {
  for (size_t i = 0, n; i < s.size(); i += n)
    if ((n = utf8_sequence_length(std::string_view(s).substr(i))) == 0) return false;
  return true;
}

// "[a, b]" -> "a,b", as a YAML list becomes for list keys.
std::string list_from_text(const std::string& text) {
  std::string out;
  std::stringstream items(text.substr(1, text.size() - 2));
  for (std::string item; std::getline(items, item, ',');)
    out += (out.empty() ? "" : ",") + trim(item);
  return out;
}

// Text -> typed value for one key, with choices and bounds checked. Used for registry defaults,
// YAML scalars and overrides alike, so all three follow the same rules.
Value parse_value(const KeySpec& spec, const std::string& text, const std::string& where) {
  switch (spec.type) {
    case KeyType::kBool:
      return parse_bool(spec, text, where);
    case KeyType::kString:
      if (spec.list && text.size() >= 2 && text.front() == '[' && text.back() == ']')
        return parse_value(spec, list_from_text(text), where);  // --set data.size=[28,28]
      // A path is bytes on Linux; only NUL cannot be in one (it would end the C string).
      if (spec.path && text.find('\0') != std::string::npos)
        fail(where, spec.key + ": '" + printable(text) + "' holds a NUL byte");
      if (!spec.path && !valid_utf8(text))
        fail(where, spec.key + ": '" + printable(text) + "' is not valid UTF-8");
      if (!spec.choices.empty() &&
          std::find(spec.choices.begin(), spec.choices.end(), text) == spec.choices.end())
        fail(where, spec.key + ": must be one of " + join(spec.choices, ", ") + "; got '" +
                        printable(text) + "'");
      return text;
    case KeyType::kInt:
    case KeyType::kFloat:
      break;
  }
  Value v =
      spec.type == KeyType::kInt ? parse_int(spec, text, where) : parse_float(spec, text, where);
  double x =
      spec.type == KeyType::kInt ? static_cast<double>(std::get<int64_t>(v)) : std::get<double>(v);
  bool low = spec.min && x < *spec.min;
  bool high = spec.max && x > *spec.max;
  if (low || high) {
    std::string range = spec.min && spec.max ? "between " + format_float(*spec.min) + " and " +
                                                   format_float(*spec.max)
                        : spec.min ? ">= " + format_float(*spec.min)
                                   : "<= " + format_float(*spec.max);
    fail(where, spec.key + ": must be " + range + ", got " + printable(text));
  }
  return v;
}

// Validates one "--set"-style assignment and returns the key's registry index.
size_t resolve_assignment_key(const std::string& key, const std::string& where) {
  if (auto i = index_of(key)) return *i;
  if (is_section(key))
    fail(where, "'" + key + "' is a section, not a key; set one of its keys: " +
                    join(index().sections.at(key), ", "));
  fail(where, unknown_key_message(key));
}

}  // namespace

const char* type_name(KeyType type) {
  switch (type) {
    case KeyType::kInt:
      return "int";
    case KeyType::kFloat:
      return "float";
    case KeyType::kBool:
      return "bool";
    case KeyType::kString:
      return "string";
  }
  return "?";
}

const KeySpec* find_key(const std::string& key) {
  auto i = index_of(key);
  return i ? &registry()[*i] : nullptr;
}

// Walks a parsed YAML document, turning nested mappings into dotted keys. Positions in messages
// are the key's (for unknown or duplicate keys) or the value's (for bad values), 1-based.
class ConfigParser {
 public:
  ConfigParser(Config& config, const std::string& source)
      : config_(config), source_(source), first_seen_(registry().size()) {}

  void run(const YAML::Node& root) {
    if (!root || root.IsNull()) return;  // empty document: all defaults
    if (!root.IsMap())
      fail(where(root.Mark()),
           "the top level must be a mapping of sections (e.g. 'train: "
           "{epochs: 1}'), got " +
               describe(root));
    walk_mapping(root, "");
  }

 private:
  std::string where(const YAML::Mark& mark) const {
    if (mark.is_null()) return source_ + ": ";
    return str_cat(source_, ":", mark.line + 1, ":", mark.column + 1, ": ");
  }

  static std::string describe(const YAML::Node& node) {
    if (node.IsMap()) return "a mapping";
    if (node.IsSequence()) return "a list";
    if (node.IsNull()) return "no value";
    return "'" + printable(node.Scalar()) + "'";
  }

  void walk_mapping(const YAML::Node& map, const std::string& prefix) {
    // yaml-cpp keeps repeated keys of one mapping rather than rejecting them; a repeated
    // section would otherwise merge silently, so reject the key text itself here.
    std::unordered_set<std::string> names;
    for (const auto& entry : map) {
      const YAML::Node& key = entry.first;
      if (!key.IsScalar() || key.Scalar().empty())
        fail(where(key.Mark()), "keys must be plain names, got " + describe(key) +
                                    (prefix.empty() ? "" : " in '" + printable(prefix) + "'"));
      std::string path = prefix.empty() ? key.Scalar() : prefix + "." + key.Scalar();
      if (!names.insert(key.Scalar()).second)
        fail(where(key.Mark()), "duplicate key '" + printable(path) + "'");
      walk(entry.second, path, key.Mark());
    }
  }

  void walk(const YAML::Node& value, const std::string& path, const YAML::Mark& key_mark) {
    if (auto i = index_of(path)) return leaf(value, *i, key_mark);
    if (is_section(path)) {
      if (value.IsNull()) return;  // "train:" with nothing under it
      if (!value.IsMap())
        fail(where(value.Mark()), "'" + path + "' is a section and needs a mapping of its keys (" +
                                      join(index().sections.at(path), ", ") + "), got " +
                                      describe(value));
      return walk_mapping(value, path);
    }
    // Unknown. Descend into a non-empty mapping anyway: "trian: {epochs: 1}" then reports
    // 'trian.epochs', which is one edit from the key the user meant.
    if (value.IsMap() && value.size() > 0) return walk_mapping(value, path);
    fail(where(key_mark), unknown_key_message(path));
  }

  void leaf(const YAML::Node& value, size_t i, const YAML::Mark& key_mark) {
    const KeySpec& spec = registry()[i];
    if (first_seen_[i])
      fail(where(key_mark), "duplicate key '" + spec.key + "' (first given at " +
                                first_seen_[i]->substr(0, first_seen_[i]->size() - 2) + ")");
    first_seen_[i] = where(key_mark);
    std::string at = where(value.Mark().is_null() ? key_mark : value.Mark());
    if (spec.list && value.IsSequence()) return config_.assign(i, list_text(value, spec, at), at);
    if (value.IsMap() || value.IsSequence())
      fail(at, spec.key + ": expected " + (spec.type == KeyType::kInt ? "an " : "a ") +
                   type_name(spec.type) + " value, got " + describe(value));
    if (value.IsNull()) {
      if (spec.type != KeyType::kString)
        fail(at, spec.key + ": expected " + (spec.type == KeyType::kInt ? "an " : "a ") +
                     type_name(spec.type) + " value, got no value");
      return config_.assign(i, "", at);
    }
    config_.assign(i, scalar_text(value, spec, at), at);
  }

  // A scalar's text; `!!binary` (base64, YAML's own tag for bytes) gives a string key bytes
  // that are not UTF-8 text, which is how to_yaml() writes such a path.
  static std::string scalar_text(const YAML::Node& value, const KeySpec& spec,
                                 const std::string& at) {
    if (value.Tag() != "tag:yaml.org,2002:binary") return value.Scalar();
    if (spec.type != KeyType::kString)
      fail(at, spec.key + ": !!binary is for text values, and this key takes " +
                   (spec.type == KeyType::kInt ? "an " : "a ") + type_name(spec.type));
    const std::vector<unsigned char> bytes = YAML::DecodeBase64(value.Scalar());
    if (bytes.empty() && !value.Scalar().empty())
      fail(at, spec.key + ": !!binary value is not base64: " + describe(value));
    return std::string(bytes.begin(), bytes.end());
  }

  // A list key's items joined by commas; each item must be a non-empty scalar.
  static std::string list_text(const YAML::Node& list, const KeySpec& spec, const std::string& at) {
    std::string text;
    for (const YAML::Node& item : list) {
      if (!item.IsScalar() || item.Scalar().empty())
        fail(at,
             spec.key + ": expected a list of numbers or words, got " + describe(item) + " in it");
      text += (text.empty() ? "" : ",") + item.Scalar();
    }
    if (text.empty()) fail(at, spec.key + ": expected a list of numbers or words, got []");
    return text;
  }

  Config& config_;
  const std::string& source_;
  std::vector<std::optional<std::string>> first_seen_;  // per key: where() it was given
};

Config::Config() {
  // Defaults are parsed once through the same validator as user input, so a default that
  // breaks its own key's rules is caught (as an internal error) on first use.
  static const std::vector<Value> kDefaults = [] {
    std::vector<Value> out;
    for (const KeySpec& spec : registry()) {
      try {
        out.push_back(parse_value(spec, spec.default_value, ""));
      } catch (const InvalidArgument& e) {
        KRAB_CHECK(false, "bad registry default: ", e.what());
      }
    }
    index();  // validate the registry's shape too
    return out;
  }();
  values_ = kDefaults;
  set_.assign(values_.size(), false);
}

Config Config::defaults() { return Config(); }

void Config::assign(size_t i, const std::string& text, const std::string& where) {
  values_[i] = parse_value(registry()[i], text, where);
  set_[i] = true;
}

Config Config::parse(const std::string& yaml_text, const std::string& source_name,
                     const std::vector<std::string>& overrides) {
  Config config;
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    std::string at = e.mark.is_null()
                         ? source_name + ": "
                         : str_cat(source_name, ":", e.mark.line + 1, ":", e.mark.column + 1, ": ");
    // yaml-cpp's words for a tab in the indentation ("illegal map value", or "illegal tab when
    // looking for indentation" a line later) do not say what to change.
    if (const auto tab = first_tab_indent(yaml_text))
      fail(str_cat(source_name, ":", tab->first, ":", tab->second, ": "),
           "a tab in the indentation; YAML indents with spaces only (" + at +
               "malformed YAML: " + printable(e.msg) + ")");
    fail(at, "malformed YAML: " + printable(e.msg));
  }
  ConfigParser(config, source_name).run(root);
  config.apply_overrides(overrides);
  return config;
}

std::vector<size_t> Config::apply_overrides(const std::vector<std::string>& overrides) {
  std::vector<size_t> assigned;
  for (const std::string& item : overrides) {
    std::string where = "--set '" + printable(item) + "': ";
    size_t eq = item.find('=');
    std::string key = trim(item.substr(0, eq));
    if (eq == std::string::npos || key.empty())
      fail(where, "expected KEY=VALUE, e.g. --set train.epochs=3");
    assigned.push_back(resolve_assignment_key(key, where));
    assign(assigned.back(), trim(item.substr(eq + 1)), where);
  }
  return assigned;
}

void Config::anchor_path(size_t i, const std::string& base) {
  if (!registry()[i].path) return;
  auto& value = std::get<std::string>(values_[i]);
  if (value.empty() || value.front() == '/') return;
  std::string anchored = (std::filesystem::path(base) / value).lexically_normal().string();
  // "." normalises to "BASE/": keep a trailing '/' only where the value had one.
  if (anchored.size() > 1 && anchored.back() == '/' && value.back() != '/') anchored.pop_back();
  value = anchored;
}

Config Config::load_file(const std::string& path, const std::vector<std::string>& overrides) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st))
    throw InvalidArgument("job file '" + path + "' does not exist" +
                          (fs::path(path).is_absolute()
                               ? std::string()
                               : " (looked for " + fs::absolute(path).string() + ")"));
  if (!fs::is_regular_file(st))
    throw InvalidArgument("job file '" + path + "' is not a regular file");
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  if (in) text << in.rdbuf();
  if (!in || in.bad())
    throw InvalidArgument("cannot read job file '" + path + "': " + std::strerror(errno));

  Config config = parse(text.str(), path);
  const std::string job_dir = fs::absolute(path).parent_path().string();
  for (size_t i = 0; i < registry().size(); ++i)
    if (config.set_[i]) config.anchor_path(i, job_dir);
  const std::string cwd = fs::current_path().string();
  for (size_t i : config.apply_overrides(overrides)) config.anchor_path(i, cwd);
  if (!config.is_set("name")) config.values_[*index_of("name")] = fs::path(path).stem().string();
  return config;
}

const Config::Value& Config::value_of(const std::string& key, const char* getter) const {
  auto i = index_of(key);
  if (!i) throw Error(str_cat("internal error: Config::", getter, "('", key, "'): no such key"));
  return values_[*i];
}

int64_t Config::get_int(const std::string& key) const {
  const Value& v = value_of(key, "get_int");
  if (auto p = std::get_if<int64_t>(&v)) return *p;
  throw Error("internal error: Config::get_int('" + key + "'): the key is a " +
              type_name(find_key(key)->type));
}

double Config::get_float(const std::string& key) const {
  const Value& v = value_of(key, "get_float");
  if (auto p = std::get_if<double>(&v)) return *p;
  if (auto p = std::get_if<int64_t>(&v)) return static_cast<double>(*p);
  throw Error("internal error: Config::get_float('" + key + "'): the key is a " +
              type_name(find_key(key)->type));
}

bool Config::get_bool(const std::string& key) const {
  const Value& v = value_of(key, "get_bool");
  if (auto p = std::get_if<bool>(&v)) return *p;
  throw Error("internal error: Config::get_bool('" + key + "'): the key is a " +
              type_name(find_key(key)->type));
}

const std::string& Config::get_string(const std::string& key) const {
  const Value& v = value_of(key, "get_string");
  if (auto p = std::get_if<std::string>(&v)) return *p;
  throw Error("internal error: Config::get_string('" + key + "'): the key is a " +
              type_name(find_key(key)->type));
}

bool Config::is_set(const std::string& key) const {
  auto i = index_of(key);
  if (!i) throw Error("internal error: Config::is_set('" + key + "'): no such key");
  return set_[*i];
}

void Config::set(const std::string& key, const std::string& value) {
  std::string where = "set '" + printable(key + "=" + value) + "': ";
  assign(resolve_assignment_key(key, where), value, where);
}

nlohmann::json Config::to_json() const {
  nlohmann::json out = nlohmann::json::object();
  const auto& keys = registry();
  for (size_t i = 0; i < keys.size(); ++i) {
    nlohmann::json* node = &out;
    std::string_view rest = keys[i].key;
    for (size_t dot; (dot = rest.find('.')) != std::string_view::npos; rest.remove_prefix(dot + 1))
      node = &(*node)[std::string(rest.substr(0, dot))];
    std::visit([&](const auto& v) { (*node)[std::string(rest)] = v; }, values_[i]);
  }
  return out;
}

namespace {
// A section tree in registry order, so to_yaml() can emit nested mappings from flat keys.
struct YamlNode {
  std::string name;
  const Value* value = nullptr;  // set for leaves
  std::vector<YamlNode> children;
  YamlNode& child(const std::string& n) {
    for (YamlNode& c : children)
      if (c.name == n) return c;
    children.push_back(YamlNode{n, nullptr, {}});
    return children.back();
  }
};

void emit(YAML::Emitter& out, const YamlNode& node) {
  out << YAML::BeginMap;
  for (const YamlNode& c : node.children) {
    out << YAML::Key << c.name << YAML::Value;
    if (!c.value) {
      emit(out, c);
    } else if (auto s = std::get_if<std::string>(c.value)) {
      if (valid_utf8(*s))
        out << YAML::DoubleQuoted << *s;  // "yes", "" and "1" must stay strings
      else  // a path's bytes (a string key takes no other); the emitter would write U+FFFD
        out << YAML::Binary(reinterpret_cast<const unsigned char*>(s->data()), s->size());
    } else if (auto d = std::get_if<double>(c.value)) {
      out << format_float(*d);
    } else if (auto b = std::get_if<bool>(c.value)) {
      out << (*b ? "true" : "false");
    } else {
      out << std::to_string(std::get<int64_t>(*c.value));
    }
  }
  out << YAML::EndMap;
}
}  // namespace

std::string Config::to_yaml() const {
  YamlNode root;
  const auto& keys = registry();
  for (size_t i = 0; i < keys.size(); ++i) {
    YamlNode* node = &root;
    std::string_view rest = keys[i].key;
    for (size_t dot; (dot = rest.find('.')) != std::string_view::npos; rest.remove_prefix(dot + 1))
      node = &node->child(std::string(rest.substr(0, dot)));
    node->child(std::string(rest)).value = &values_[i];
  }
  YAML::Emitter out;
  emit(out, root);
  return std::string(out.c_str()) + "\n";
}

bool Config::operator==(const Config& other) const { return values_ == other.values_; }

}  // namespace krab::core
