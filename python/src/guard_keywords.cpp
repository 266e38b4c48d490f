#include "guard_keywords.hpp"

#include <stdexcept>
#include <string>

#include "nanscope/core/fallback_mode.hpp"
#include "nanscope/core/guard_option_list.hpp"

namespace py = pybind11;

namespace nanscope::python {

namespace {

std::string repr_text(const py::handle& value) { return py::repr(value).cast<std::string>(); }

[[noreturn]] void wrong_type(const std::string& who, const GuardOption& option, const char* wanted,
                             const py::handle& value) {
  throw py::type_error(who + ": " + option.name + " must be " + wanted + ", not " + repr_text(value));
}

// The option's value as the text its declaration reads. A str is taken as it
// is written ("on", "bf16"); torch.bfloat16 reads as its str.
std::string text_of(const GuardOption& option, const py::handle& value, const std::string& who) {
  const bool is_bool = py::isinstance<py::bool_>(value);
  switch (option.kind) {
    case OptionKind::on_off:  // its truth, as Python's own flags take it (numpy's bool too); "on"/"off" as written
      if (py::isinstance<py::str>(value)) return value.cast<std::string>();
      if (const int truth = PyObject_IsTrue(value.ptr()); truth >= 0) return truth ? "on" : "off";
      throw py::error_already_set();
    case OptionKind::integer: {  // an int, or a float that is one (25.0, steps / 10)
      if (is_bool) wrong_type(who, option, "an int", value);
      if (py::hasattr(value, "__index__"))
        return py::str(py::module_::import("operator").attr("index")(value)).cast<std::string>();
      if (py::isinstance<py::float_>(value) && value.attr("is_integer")().cast<bool>())
        return py::str(py::int_(py::reinterpret_borrow<py::object>(value))).cast<std::string>();
      wrong_type(who, option, "an int", value);
    }
    case OptionKind::number:
      if (is_bool || !py::hasattr(value, "__float__") || py::isinstance<py::str>(value))
        wrong_type(who, option, "a number", value);
      return repr_text(py::float_(py::reinterpret_borrow<py::object>(value)));  // every digit of the double
    case OptionKind::names: {
      if (py::isinstance<py::str>(value)) return value.cast<std::string>();
      if (!py::isinstance<py::iterable>(value)) wrong_type(who, option, "a list of module paths", value);
      std::string joined;
      for (const py::handle name : value) {
        if (!py::isinstance<py::str>(name)) wrong_type(who, option, "a list of module paths (str)", name);
        joined += (joined.empty() ? "" : ",") + name.cast<std::string>();
      }
      return joined;
    }
    case OptionKind::word: return py::str(value).cast<std::string>();
    case OptionKind::directory:  // str, bytes or os.PathLike
      return py::module_::import("os").attr("fsdecode")(value).cast<std::string>();
  }
  return py::str(value).cast<std::string>();
}

py::object python_value(const GuardOption& option, const std::string& text) {
  switch (option.kind) {
    case OptionKind::on_off: return py::bool_(text == "on");
    // Read by Python, which reads numbers whatever the C locale says.
    case OptionKind::integer: return py::module_::import("builtins").attr("int")(text);
    case OptionKind::number: return py::module_::import("builtins").attr("float")(text);
    case OptionKind::names: return py::tuple(py::cast(parse_fp32_modules(text)));
    case OptionKind::word:
    case OptionKind::directory: return py::str(text);
  }
  return py::str(text);
}

}  // namespace

void set_guard_keywords(GuardOptions& options, const py::dict& keywords, const std::string& who) {
  for (const auto& [key, value] : keywords) {
    const std::string name = py::str(key).cast<std::string>();
    const GuardOption* option = find_guard_option(name);
    if (!option) {
      std::string known;
      for (const GuardOption& o : guard_option_list()) known += (known.empty() ? "" : ", ") + o.name;
      throw py::type_error(who + "() got an unexpected keyword argument '" + name + "'; its options are " + known);
    }
    try {
      option->set(options, text_of(*option, value, who));
    } catch (const std::invalid_argument& e) {
      throw py::value_error(who + ": " + name + " " + e.what());
    }
  }
}

py::list guard_keyword_list() {
  const GuardOptions defaults;
  py::list list;
  for (const GuardOption& option : guard_option_list()) {
    py::dict entry;
    entry["name"] = option.name;
    entry["default"] = python_value(option, option.text(defaults));
    entry["help"] = option_help(option, OptionSpelling::keyword);
    entry["words"] = option.words;
    list.append(entry);
  }
  return list;
}

}  // namespace nanscope::python
