// TRAINERD_UNDER_ASAN: defined when this file is compiled with AddressSanitizer (GCC's
// __SANITIZE_ADDRESS__, Clang's __has_feature), for the sandboxed programs (trainerd-worker,
// trainerd-module-check), which cannot take the limits and leak check that ASan's own memory
// mappings and ptrace-based leak checker break. Each program sets its own ASan options.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define TRAINERD_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TRAINERD_UNDER_ASAN 1
#endif
#endif
