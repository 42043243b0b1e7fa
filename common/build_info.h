/*
** build_info.h — the build's identity, recorded in every trace and the `builds` table and printed
** by `sparsetrace --version`: the git revision (12 hex digits, "-dirty" when the source paths
** differ from it, "unknown" outside a checkout), the compiler and the build type. `--version` also
** prints the sources: a digest of the source paths' git trees at that revision, equal for two
** commits that change only models, docs, bench, tests or tools (cmake/build_info.cmake lists the
** paths). The definitions are generated at every build, so they are never a configure step stale.
*/
#ifndef ST_COMMON_BUILD_INFO_H
#define ST_COMMON_BUILD_INFO_H

extern const char st_build_revision[]; /* "22581ff4d7f3", "22581ff4d7f3-dirty", "unknown" */
extern const char st_build_sources[];  /* "9c1e0b4d27aa", "modified" (dirty), "unknown" */
extern const char st_build_compiler[]; /* "GNU-12.2.0" */
extern const char st_build_type[];     /* "RelWithDebInfo", "Debug+asan+ubsan" */

#endif
