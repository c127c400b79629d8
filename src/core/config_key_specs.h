// Internal to core's key table (config_key_table.cpp and the section files beside it): the
// makers of KeySpec entries and the sections defined outside config_key_table.cpp.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"

namespace krab::core::key_specs {

using Bound = std::optional<double>;
constexpr std::nullopt_t kNone = std::nullopt;

inline KeySpec int_key(std::string key, std::string def, std::string doc, Bound min,
                       Bound max = kNone) {
  return {std::move(key), KeyType::kInt, std::move(def), std::move(doc), {}, min, max};
}
inline KeySpec float_key(std::string key, std::string def, std::string doc, Bound min,
                         Bound max = kNone) {
  return {std::move(key), KeyType::kFloat, std::move(def), std::move(doc), {}, min, max};
}
inline KeySpec bool_key(std::string key, std::string def, std::string doc) {
  return {std::move(key), KeyType::kBool, std::move(def), std::move(doc), {}, kNone, kNone};
}
inline KeySpec string_key(std::string key, std::string def, std::string doc,
                          std::vector<std::string> choices = {}) {
  return {std::move(key), KeyType::kString,   std::move(def),
          std::move(doc), std::move(choices), kNone,
          kNone};
}

// A string key that also takes a list of numbers or words (KeySpec::list).
inline KeySpec list_key(std::string key, std::string def, std::string doc) {
  KeySpec spec = string_key(std::move(key), std::move(def), std::move(doc));
  spec.list = true;
  return spec;
}

// A string key naming a file or directory (KeySpec::path): any bytes but NUL, and a relative
// value is anchored to the job file's folder.
inline KeySpec path_key(std::string key, std::string def, std::string doc) {
  KeySpec spec = string_key(std::move(key), std::move(def), std::move(doc));
  spec.path = true;
  return spec;
}

// Federated learning's sections (config_key_table_federated.cpp).
std::vector<KeySpec> federated_cohort_keys();
std::vector<KeySpec> federated_aggregation_keys();
std::vector<KeySpec> federated_privacy_keys();
std::vector<KeySpec> federated_server_keys();

}  // namespace krab::core::key_specs
