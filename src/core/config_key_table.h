// The key table behind core::registry() (config.h), apart from its renderer so that neither
// file grows past a screenful of sections: one function per section of docs/config.md.
#pragma once

#include <vector>

#include "core/config.h"

namespace krab::core {

// Every key, section by section in the order docs/config.md lists them. Called once, by
// registry(); pure.
std::vector<KeySpec> build_registry();

}  // namespace krab::core
