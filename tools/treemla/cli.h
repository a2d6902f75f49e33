// The treemla commands' options, on CLI11. Every option has a default (shown by --help), a help
// line and a check of its value; a bad option gets a message naming it and the bound it broke,
// and exit code 2. Options are written `--name value` or `--name=value`; a later one overrides
// an earlier one.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace treemla::tool::cli {

// Sets the conventions above on the app of a command, made as
// `CLI::App app(summary, "treemla <command>")`.
void configure(CLI::App& app);

// The whole of `text` as a decimal integer; false if it is not one (or out of int64 range).
bool parse_integer(const std::string& text, int64_t& x);

// Value checks; each message reads "--name: 'value' must be ...".
CLI::Validator integer_in(int64_t lo, int64_t hi);
CLI::Validator number_in(double lo, double hi);
CLI::Validator power_of_two_in(int64_t lo, int64_t hi);
CLI::Validator one_of(std::vector<std::string> choices);

// An integer option within [lo, hi], with its default shown.
template <class T>
CLI::Option* add_integer(CLI::App& app, const std::string& name, T& value, int64_t lo, int64_t hi,
                         const std::string& help) {
  return app.add_option(name, value, help)->check(integer_in(lo, hi))->capture_default_str();
}
// A real option within [lo, hi], with its default shown.
CLI::Option* add_number(CLI::App& app, const std::string& name, double& value, double lo, double hi,
                        const std::string& help);
// A comma-separated list option; `check` applies to each element. Repeated, the lists add up.
CLI::Option* add_list(CLI::App& app, const std::string& name, std::vector<int64_t>& values,
                      CLI::Validator check, const std::string& help);
// A string option that takes one of `choices`, with its default shown.
CLI::Option* add_choice(CLI::App& app, const std::string& name, std::string& value,
                        std::vector<std::string> choices, const std::string& help);
// A comma-separated list whose every entry is one of `choices`.
CLI::Option* add_choice_list(CLI::App& app, const std::string& name,
                             std::vector<std::string>& values, std::vector<std::string> choices,
                             const std::string& help);

// Parses argv[2..] (argv[1] is the command). Returns nothing when the command should run, or
// the exit code when it should not: 0 after --help (printed to stdout), 2 after a bad option
// (a message on stderr). `check` runs after parsing: the rules that tie options together; a
// std::invalid_argument it throws is a bad option too.
std::optional<int> parse(CLI::App& app, int argc, char** argv,
                         const std::function<void()>& check = {});

// Prints "treemla <command>: message (see treemla <command> --help)" to stderr; returns 2.
int usage_error(const CLI::App& app, const std::string& message);

}  // namespace treemla::tool::cli
