// The treemla commands' options on CLI11: value checks with messages that name the bound, and
// one parse step that turns every problem into exit code 2.
#include "cli.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <charconv>
#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <utility>

namespace treemla::tool::cli {

namespace {

std::string in_quotes(const std::string& s) { return "'" + s + "'"; }

}  // namespace

bool parse_integer(const std::string& text, int64_t& x) {
  const char* end = text.data() + text.size();
  const auto [p, ec] = std::from_chars(text.data(), end, x);
  return !text.empty() && ec == std::errc() && p == end;
}

void configure(CLI::App& app) {
  app.allow_extras();  // parse() names an unknown option itself, in the order given
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.get_formatter()->column_width(40);
}

CLI::Validator integer_in(int64_t lo, int64_t hi) {
  const std::string bound = fmt::format("[{}, {}]", lo, hi);
  return CLI::Validator(
      [lo, hi, bound](std::string& s) -> std::string {
        int64_t x = 0;
        if (parse_integer(s, x) && x >= lo && x <= hi) return {};
        return in_quotes(s) + " must be an integer in " + bound;
      },
      bound);
}

CLI::Validator number_in(double lo, double hi) {
  const std::string bound = fmt::format("[{:g}, {:g}]", lo, hi);
  return CLI::Validator(
      [lo, hi, bound](std::string& s) -> std::string {
        char* end = nullptr;
        const double x = std::strtod(s.c_str(), &end);
        if (!s.empty() && *end == '\0' && x >= lo && x <= hi) return {};
        return in_quotes(s) + " must be a number in " + bound;
      },
      bound);
}

CLI::Validator power_of_two_in(int64_t lo, int64_t hi) {
  const std::string bound = fmt::format("a power of two in [{}, {}]", lo, hi);
  return CLI::Validator(
      [lo, hi, bound](std::string& s) -> std::string {
        int64_t x = 0;
        if (parse_integer(s, x) && x >= lo && x <= hi && (x & (x - 1)) == 0) return {};
        return in_quotes(s) + " must be " + bound;
      },
      bound);
}

CLI::Validator one_of(std::vector<std::string> choices) {
  const std::string desc = fmt::format("{{{}}}", fmt::join(choices, ","));
  std::string said = choices.back();
  if (choices.size() > 1)
    said = fmt::format("{} or {}", fmt::join(choices.begin(), choices.end() - 1, ", "), said);
  return CLI::Validator(
      [choices = std::move(choices), said](std::string& s) -> std::string {
        for (const std::string& c : choices) {
          if (s == c) return {};
        }
        return in_quotes(s) + " must be " + said;
      },
      desc);
}

CLI::Option* add_number(CLI::App& app, const std::string& name, double& value, double lo, double hi,
                        const std::string& help) {
  return app.add_option(name, value, help)->check(number_in(lo, hi))->capture_default_str();
}

CLI::Option* add_list(CLI::App& app, const std::string& name, std::vector<int64_t>& values,
                      CLI::Validator check, const std::string& help) {
  return app.add_option(name, values, help + " (comma-separated)")
      ->delimiter(',')
      ->check(std::move(check))
      ->capture_default_str();
}

CLI::Option* add_choice(CLI::App& app, const std::string& name, std::string& value,
                        std::vector<std::string> choices, const std::string& help) {
  return app.add_option(name, value, help)
      ->check(one_of(std::move(choices)))
      ->capture_default_str();
}

CLI::Option* add_choice_list(CLI::App& app, const std::string& name,
                             std::vector<std::string>& values, std::vector<std::string> choices,
                             const std::string& help) {
  return app.add_option(name, values, help + " (comma-separated)")
      ->delimiter(',')
      ->check(one_of(std::move(choices)))
      ->capture_default_str();
}

std::optional<int> parse(CLI::App& app, int argc, char** argv, const std::function<void()>& check) {
  try {
    app.parse(argc - 1, argv + 1);  // argv[1], the command, stands where CLI11 expects the program
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::ParseError& e) {
    return usage_error(app, e.what());
  }
  const std::vector<std::string> extra = app.remaining();
  if (!extra.empty()) {
    const std::string& a = extra.front();
    if (a.size() > 1 && a[0] == '-')
      return usage_error(app, "unknown option " + a.substr(0, a.find('=')));
    return usage_error(app, "unexpected argument " + in_quotes(a));
  }
  if (check) {
    try {
      check();
    } catch (const std::invalid_argument& e) {
      return usage_error(app, e.what());
    }
  }
  return std::nullopt;
}

int usage_error(const CLI::App& app, const std::string& message) {
  std::cerr << app.get_name() << ": " << message << " (see " << app.get_name() << " --help)\n";
  return 2;
}

}  // namespace treemla::tool::cli
