// KRAB_UNDER_SANITIZER: 1 in an ASan or TSan build, else 0. Tests that measure resident memory
// skip those bounds there: the sanitizers' allocators ignore mallopt and keep freed memory in
// quarantine.
#pragma once

// gcc defines __SANITIZE_ADDRESS__ / __SANITIZE_THREAD__; clang (the ASan build's compiler)
// answers __has_feature instead.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define KRAB_UNDER_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define KRAB_UNDER_SANITIZER 1
#endif
#endif
#ifndef KRAB_UNDER_SANITIZER
#define KRAB_UNDER_SANITIZER 0
#endif
