// A small "--name value" option parser for the treemla subcommands. Every option has a default,
// a help line, and a bound check; a bad option gets a message naming it and a non-zero exit.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace treemla::tool {

class Options {
 public:
  Options(std::string command, std::string summary)
      : command_(std::move(command)), summary_(std::move(summary)) {}

  void add(const std::string& name, const std::string& def, const std::string& help) {
    order_.push_back(name);
    values_[name] = def;
    help_[name] = help;
  }
  void add_flag(const std::string& name, const std::string& help) {
    add(name, "0", help);
    flags_[name] = true;
  }

  // Returns false (after printing) on --help or a bad option; `ok` tells which.
  bool parse(int argc, char** argv, int first, bool& ok) {
    ok = true;
    for (int i = first; i < argc; ++i) {
      std::string a = argv[i];
      if (a == "--help" || a == "-h") {
        print_help(std::cout);
        return false;
      }
      if (a.rfind("--", 0) != 0) return fail("unexpected argument '" + a + "'", ok);
      std::string name = a.substr(2), value;
      const auto eq = name.find('=');
      if (eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
      }
      if (!values_.count(name)) return fail("unknown option --" + name, ok);
      if (flags_.count(name)) {
        values_[name] = eq == std::string::npos ? "1" : value;
        continue;
      }
      if (eq == std::string::npos) {
        if (i + 1 >= argc) return fail("option --" + name + " needs a value", ok);
        value = argv[++i];
      }
      values_[name] = value;
    }
    return true;
  }

  std::string str(const std::string& name) const { return values_.at(name); }
  bool flag(const std::string& name) const { return values_.at(name) != "0"; }

  // Integer option within [lo, hi]; throws std::invalid_argument naming the option otherwise.
  int64_t integer(const std::string& name, int64_t lo, int64_t hi) const {
    const std::string& v = values_.at(name);
    char* end = nullptr;
    const long long x = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0') bad(name, v, "an integer");
    if (x < lo || x > hi) {
      std::ostringstream os;
      os << "an integer in [" << lo << ", " << hi << "]";
      bad(name, v, os.str());
    }
    return x;
  }
  double real(const std::string& name, double lo, double hi) const {
    const std::string& v = values_.at(name);
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || !(x >= lo && x <= hi)) {
      std::ostringstream os;
      os << "a number in [" << lo << ", " << hi << "]";
      bad(name, v, os.str());
    }
    return x;
  }
  // Comma-separated integers, each within [lo, hi].
  std::vector<int64_t> list(const std::string& name, int64_t lo, int64_t hi) const {
    std::vector<int64_t> out;
    std::stringstream ss(values_.at(name));
    std::string item;
    while (std::getline(ss, item, ',')) {
      char* end = nullptr;
      const long long x = std::strtoll(item.c_str(), &end, 10);
      if (item.empty() || *end != '\0' || x < lo || x > hi) {
        std::ostringstream os;
        os << "a comma-separated list of integers in [" << lo << ", " << hi << "]";
        bad(name, values_.at(name), os.str());
      }
      out.push_back(x);
    }
    if (out.empty()) bad(name, values_.at(name), "a non-empty list");
    return out;
  }

  void print_help(std::ostream& os) const {
    os << "usage: treemla " << command_ << " [options]\n\n" << summary_ << "\n\noptions:\n";
    for (const auto& n : order_) {
      os << "  --" << n;
      if (!flags_.count(n)) os << " <" << values_.at(n) << ">";
      os << "\n      " << help_.at(n) << "\n";
    }
  }

 private:
  bool fail(const std::string& msg, bool& ok) const {
    std::cerr << "treemla " << command_ << ": " << msg << " (see treemla " << command_ << " --help)\n";
    ok = false;
    return false;
  }
  [[noreturn]] static void bad(const std::string& name, const std::string& v, const std::string& want) {
    throw std::invalid_argument("--" + name + " = '" + v + "' must be " + want);
  }

  std::string command_, summary_;
  std::vector<std::string> order_;
  std::map<std::string, std::string> values_, help_;
  std::map<std::string, bool> flags_;
};

}  // namespace treemla::tool
