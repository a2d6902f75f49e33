// treemla: measurement and test switches read from the environment (host code).
//
// A switch that is set must hold one of the values it documents: anything else throws
// treemla::Error naming the variable, the value it got and what it takes, so that a typo in a
// measurement run fails at the first call instead of silently measuring the default.
#pragma once

#include <initializer_list>
#include <vector>

namespace treemla::detail {

// Whether `var` is set: it has a non-empty value (an empty one counts as unset, as everywhere
// here).
bool env_set(const char* var);

// `var` unset (or empty): `unset_index`. Set: the index in `names` of its value (exact match).
int env_choice(const char* var, std::initializer_list<const char*> names, int unset_index);

// `var` unset (or empty): `unset_value`. Set: a whole decimal integer in [lo, hi].
long env_int(const char* var, long lo, long hi, long unset_value);

// `var` unset (or empty): an empty vector. Set: exactly `count` decimal integers in [lo, hi],
// separated by commas.
std::vector<long> env_ints(const char* var, int count, long lo, long hi);

}  // namespace treemla::detail
