#include "engine/engine.h"

#include "comm/communicator.h"

namespace krab::engine {

// Out of line: the default destroys nothing, but a unique_ptr of the incomplete type would
// still need its deleter wherever it is defined.
std::unique_ptr<comm::Communicator> Engine::take_group() { return nullptr; }

}  // namespace krab::engine
