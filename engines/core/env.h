// The engines' environment switches (LB_GPU_*, LB_MK_*: A/B experiments, documented where each is read).
#pragma once

#include <cstdlib>

namespace lb {

// A default-on switch: a value starting with '0' turns it off (LB_X=0).
inline bool env_off(const char* name) {
    const char* v = std::getenv(name);
    return v && v[0] == '0';
}

// A default-off switch: any value but empty or "0" turns it on.
inline bool env_on(const char* name) {
    const char* v = std::getenv(name);
    return v && *v && !(v[0] == '0' && v[1] == 0);
}

}  // namespace lb
