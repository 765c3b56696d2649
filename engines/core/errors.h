// Engine errors carry a protocol `kind` (docs/protocol.md): load, bad_request, context_overflow,
// unsupported, oom, internal. The server turns them into one JSON error line.
#pragma once
#include <stdexcept>
#include <string>

namespace lb {

struct EngineError : std::runtime_error {
    std::string kind;
    EngineError(std::string kind_, const std::string& message) : std::runtime_error(message), kind(std::move(kind_)) {}
};

[[noreturn]] inline void fail(const std::string& kind, const std::string& message) { throw EngineError(kind, message); }

}  // namespace lb
