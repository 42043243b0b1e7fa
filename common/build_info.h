/*
** build_info.h — the build's identity, recorded in every trace and the `builds` table and printed
** by `sparsetrace --version`: the git revision (12 hex digits, "-dirty" when tracked files differ
** from it, "unknown" outside a checkout), the compiler and the build type. The definitions are
** generated at every build (cmake/build_info.cmake), so they are never a configure step stale.
*/
#ifndef ST_COMMON_BUILD_INFO_H
#define ST_COMMON_BUILD_INFO_H

extern const char st_build_revision[]; /* "22581ff4d7f3", "22581ff4d7f3-dirty", "unknown" */
extern const char st_build_compiler[]; /* "GNU-12.2.0" */
extern const char st_build_type[];     /* "RelWithDebInfo", "Debug+asan+ubsan" */

#endif
