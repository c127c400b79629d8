// krab's configuration registry and the resolved job configuration.
//
// Every knob krab has is one entry in a single registry (registry(), defined in
// config_keys.cpp): a dotted key, a type, a default, a one-sentence doc and, where it applies,
// the allowed choices or numeric bounds. Three things are derived from that one list, so they
// cannot drift apart:
//   - parsing: a key the registry does not know is an error, with a "did you mean" hint;
//   - validation: type, choices and bounds are checked where the value enters, and the error
//     names the file, line and column (or the --set argument) that gave it;
//   - documentation: docs/config.md is render_markdown()'s output, and a test keeps the
//     checked-in file equal to it byte for byte.
//
// A job file is YAML whose top level is a mapping of sections, each a mapping of keys; the
// `train.optimizer` keys sit in a nested mapping, and `name` is a scalar at the top level:
//
//   name: mnist-dp
//   model: {name: cnn}
//   train:
//     epochs: 2
//     optimizer: {name: sgd, lr: 0.05}
//
// A key may also be written dotted at any level (`train.optimizer.lr: 0.1`, or `lr` inside an
// `optimizer:` mapping inside `train:`), the same spelling --set uses. An empty file or a
// document that is just `null` means "all defaults"; a section given as null (`train:` with
// nothing under it) is an empty section.
//
// Values by type:
//   int     decimal integer, optional sign; 1.5, 1e3 and 3.0 are rejected.
//   float   any finite decimal number: 1, 0.05, 1e-3. nan and inf are rejected.
//   bool    true/false, yes/no, on/off (also capitalised or upper case).
//   string  the scalar's text; a YAML null gives "". Quoting is optional ("yes" stays "yes").
// Bounds (KeySpec::min/max) are inclusive. Values are checked one key at a time; rules that tie
// keys together (model.heads must divide model.width) belong to the code that uses them.
//
// Errors. Everything the user can get wrong throws krab::InvalidArgument whose message says
// where (`job.yaml:4:3: ` or `--set 'train.epoch=3': `) and what: the full dotted key, the
// expected type or the allowed values, and the value given. Asking a Config for a key that does
// not exist, or with the wrong getter, is a bug in krab and throws krab::Error.
//
// Thread safety: registry() is immutable after first use and safe to call from any thread.
// Config is a plain value type: concurrent const calls are safe; set() needs exclusive access.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace krab::core {

enum class KeyType { kInt, kFloat, kBool, kString };

// "int", "float", "bool" or "string", as used in messages and docs/config.md.
const char* type_name(KeyType type);

// One configuration knob.
struct KeySpec {
  std::string key;  // dotted path, e.g. "train.optimizer.lr"
  KeyType type;
  std::string default_value;         // as text, parsed by type ("" allowed for strings)
  std::string doc;                   // one sentence for docs/config.md
  std::vector<std::string> choices;  // for strings: allowed values (empty = any)
  std::optional<double> min;         // numeric lower bound (inclusive), if any
  std::optional<double> max;         // numeric upper bound (inclusive), if any
  // Strings only: a YAML list of scalars (`size: [28, 28]`, `--set data.size=[28,28]`) is
  // accepted and stored as its items joined by commas ("28,28"), the form the key's reader
  // parses; a list of anything else is refused.
  bool list = false;
  // Strings only: a file or directory (docs/config.md's type "path"). Its value may hold any
  // bytes but NUL, as a Linux path may (other strings must be UTF-8). load_file() makes a
  // relative value absolute: one written in the job file against the job file's folder, one
  // given with --set against the current directory; a default stays as it is.
  bool path = false;
};

// All keys, in documentation order. Keys are unique and no key is a prefix section of another
// ("train" is a section, so it is never a key). Defined in config_keys.cpp.
const std::vector<KeySpec>& registry();

// The registry entry for a dotted key, or nullptr if there is none.
const KeySpec* find_key(const std::string& key);

// A resolved job configuration: every registry key has a value, either the registry default or
// one given explicitly by the job file, an override or set(). Cheap to copy.
class Config {
 public:
  // All defaults; the same as defaults().
  Config();
  static Config defaults();

  // Parses YAML text, then applies `overrides`, each "a.b.c=value" (the CLI's --set), in order;
  // an override wins over the file and a later override over an earlier one. `source_name`
  // (usually the file path) prefixes every message about the text. Throws InvalidArgument on:
  // malformed YAML (message has source_name, line and column); an unknown key (full dotted key,
  // plus "did you mean 'x'?" when a registry key is close in spelling or shares the last
  // component); a duplicate key; a value of the wrong type (key, expected type, value given);
  // a value outside the choices (they are listed) or the bounds; a mapping or list where a
  // scalar is expected, or a scalar where a section's mapping is expected; an override that is
  // not KEY=VALUE. `name` stays "" unless given.
  static Config parse(const std::string& yaml_text, const std::string& source_name,
                      const std::vector<std::string>& overrides = {});

  // Reads and parses the job file at `path` (its path is the source_name in messages). When
  // neither the file nor an override sets `name`, it becomes the file's stem ("jobs/mnist.yaml"
  // -> "mnist"); that derived value does not count as is_set(). A missing, unreadable or
  // non-regular file throws InvalidArgument naming the path. Relative values of path keys
  // (KeySpec::path) become absolute, as Compose and Kubernetes resolve theirs: those written in
  // the file against the file's folder (so a job runs the same from any directory), those of
  // `overrides` against the current directory (where the shell that typed them is); the
  // registry defaults (checkpoint.dir "runs/{name}") stay relative to the current directory.
  // parse() leaves every value as written.
  static Config load_file(const std::string& path, const std::vector<std::string>& overrides = {});

  // Typed getters. An unknown key or a getter that does not match the key's type is a
  // programming error and throws krab::Error (not InvalidArgument). get_float also accepts int
  // keys. The reference from get_string stays valid until this Config is modified or destroyed.
  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  const std::string& get_string(const std::string& key) const;

  // True when the value was given explicitly by the file, an override or set(), even if it
  // equals the default.
  bool is_set(const std::string& key) const;

  // Sets one key from text, validated exactly like --set (InvalidArgument on an unknown key or
  // a bad value, with the message prefixed "set 'key=value': "), and marks it as set.
  void set(const std::string& key, const std::string& value);

  // Nested object of all resolved values, typed (ints as integers, floats as numbers), keyed by
  // section: {"name": "", "model": {"name": "cnn", ...}, "train": {"optimizer": {...}, ...}}.
  nlohmann::json to_json() const;

  // All resolved values as a YAML job file in registry order; parse(to_yaml()) == *this for
  // UTF-8 values (YAML text is UTF-8: a path key's other bytes come back as U+FFFD).
  std::string to_yaml() const;

  // Compares resolved values only; which keys were is_set() does not matter.
  bool operator==(const Config& other) const;
  bool operator!=(const Config& other) const { return !(*this == other); }

 private:
  using Value = std::variant<int64_t, double, bool, std::string>;
  friend class ConfigParser;  // config.cpp: walks the YAML tree and fills values_

  // Validates `text` for registry()[index] and stores it; `where` prefixes any message.
  void assign(size_t index, const std::string& text, const std::string& where);
  // Applies --set overrides in order; returns the registry indices they assigned.
  std::vector<size_t> apply_overrides(const std::vector<std::string>& overrides);
  // Makes the relative value of path key `index` absolute against the directory `base`.
  void anchor_path(size_t index, const std::string& base);
  const Value& value_of(const std::string& key, const char* getter) const;

  std::vector<Value> values_;  // parallel to registry()
  std::vector<bool> set_;      // parallel to registry(): given explicitly
};

// The full text of docs/config.md, generated from registry(): a header saying the file is
// generated, a short example job, then one table per section (key, type, default, allowed
// values, description).
std::string render_markdown();

}  // namespace krab::core
