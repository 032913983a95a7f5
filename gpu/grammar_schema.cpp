// JSON Schema -> GBNF (structured outputs, docs/serving.md): the schema compiler of
// gpu/grammar.hpp. Rules are generated in the schema's declared key order (ordered_json).
#include <nlohmann/json.hpp>

#include <cctype>
#include <functional>
#include <map>
#include <set>

#include "gpu/grammar.hpp"

namespace weft::gpu::grammar {

std::string json_object_gbnf() {
  return R"(root ::= object
value ::= object | array | string | number | boolean | null
object ::= "{" ws ( string ws ":" ws value ( ws "," ws string ws ":" ws value )* )? ws "}"
array ::= "[" ws ( value ( ws "," ws value )* )? ws "]"
string ::= "\"" char* "\""
char ::= [^"\\\x00-\x1f] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} )
number ::= integer ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?
integer ::= "-"? ( "0" | [1-9] [0-9]{0,15} )
boolean ::= "true" | "false"
null ::= "null"
ws ::= " "?
)";
}

namespace {

/// A GBNF literal for raw bytes.
std::string literal(const std::string& bytes) {
  std::string out = "\"";
  for (unsigned char c : bytes) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      static const char* hexd = "0123456789abcdef";
      out += "\\x";
      out += hexd[c >> 4];
      out += hexd[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

using ojson = nlohmann::ordered_json;

class schema_compiler {
 public:
  explicit schema_compiler(const ojson& root) : root_(root) {}

  result<std::string> run() {
    auto r = visit(root_, "root-value", "#");
    if (!r) return r.error();
    std::string out = "root ::= " + *r + "\n";
    for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
    // The generic JSON rules (value, string, ...) for unconstrained parts.
    out += json_object_gbnf().substr(json_object_gbnf().find('\n') + 1);
    return out;
  }

 private:
  static status bad(const std::string& path, const std::string& what) {
    return {status_code::invalid_argument, "json_schema at " + path + ": " + what};
  }
  std::string fresh(const std::string& hint) {
    std::string base;
    for (char c : hint) base += (std::isalnum(static_cast<unsigned char>(c)) != 0) ? c : '-';
    if (base.empty() || !(std::isalpha(static_cast<unsigned char>(base[0])) != 0))
      base = "r-" + base;
    std::string name = base;
    for (int i = 2; used_.count(name) != 0; ++i) name = base + "-" + std::to_string(i);
    used_.insert(name);
    return name;
  }
  std::string add(const std::string& hint, const std::string& body) {
    const std::string name = fresh(hint);
    rules_.emplace_back(name, body);
    return name;
  }

  result<std::string> visit(const ojson& s, const std::string& hint, const std::string& path) {
    if (++depth_ > 64) return bad(path, "nested deeper than 64 levels");
    struct guard {
      int& d;
      ~guard() { --d; }
    } g{depth_};
    if (s.is_boolean()) {
      if (!s.get<bool>()) return bad(path, "the schema 'false' admits nothing");
      return std::string{"value"};
    }
    if (!s.is_object()) return bad(path, "a schema must be an object or a boolean");
    static const std::set<std::string> unsupported = {"pattern",
                                                      "format",
                                                      "minimum",
                                                      "maximum",
                                                      "exclusiveMinimum",
                                                      "exclusiveMaximum",
                                                      "multipleOf",
                                                      "uniqueItems",
                                                      "minProperties",
                                                      "maxProperties",
                                                      "patternProperties",
                                                      "propertyNames",
                                                      "not",
                                                      "if",
                                                      "then",
                                                      "else",
                                                      "dependentRequired",
                                                      "dependentSchemas",
                                                      "contains",
                                                      "minContains",
                                                      "maxContains",
                                                      "unevaluatedProperties",
                                                      "unevaluatedItems",
                                                      "contentEncoding",
                                                      "contentMediaType",
                                                      "dependencies"};
    for (const auto& [k, v] : s.items()) {
      if (unsupported.count(k) != 0)
        return bad(
            path, "unsupported JSON Schema keyword '" + k +
                      "' (the grammar cannot enforce it; docs/serving.md lists what is supported)");
    }
    if (s.contains("$ref")) {
      const std::string ref = s["$ref"].get<std::string>();
      if (ref.rfind("#/$defs/", 0) != 0 && ref.rfind("#/definitions/", 0) != 0)
        return bad(path, "$ref '" + ref + "': only #/$defs/NAME and #/definitions/NAME");
      auto it = refs_.find(ref);
      if (it != refs_.end()) return it->second;
      const std::string section = ref.rfind("#/$defs/", 0) == 0 ? "$defs" : "definitions";
      const std::string def = ref.substr(section.size() + 3);
      if (!root_.contains(section) || !root_[section].contains(def))
        return bad(path, "$ref '" + ref + "' names no definition");
      const std::string name = fresh("def-" + def);
      refs_[ref] = name;
      auto body = visit(root_[section][def], name + "-body", ref);
      if (!body) return body.error();
      rules_.emplace_back(name, *body);
      return name;
    }
    if (s.contains("const")) return add(hint + "-const", literal(s["const"].dump()));
    if (s.contains("enum")) {
      if (!s["enum"].is_array() || s["enum"].empty())
        return bad(path, "enum must be a non-empty array");
      std::string body;
      for (const auto& v : s["enum"]) body += (body.empty() ? "" : " | ") + literal(v.dump());
      return add(hint + "-enum", body);
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      if (!s[key].is_array() || s[key].empty())
        return bad(path, std::string{key} + " must be a non-empty array");
      std::string body;
      size_t i = 0;
      for (const auto& sub : s[key]) {
        auto r =
            visit(sub, hint + "-" + std::to_string(i), path + "/" + key + "/" + std::to_string(i));
        if (!r) return r.error();
        body += (body.empty() ? "" : " | ") + *r;
        ++i;
      }
      return add(hint + "-alt", body);
    }
    if (s.contains("allOf")) {
      if (s["allOf"].is_array() && s["allOf"].size() == 1)
        return visit(s["allOf"][0], hint, path + "/allOf/0");
      return bad(path, "unsupported JSON Schema keyword 'allOf' with more than one schema");
    }
    ojson type = s.value("type", ojson());
    if (type.is_null()) {
      if (s.contains("properties"))
        type = "object";
      else if (s.contains("items") || s.contains("prefixItems"))
        type = "array";
      else
        return std::string{"value"};
    }
    if (type.is_array()) {
      std::string body;
      for (const auto& t : type) {
        ojson sub = s;
        sub["type"] = t;
        auto r = visit(sub, hint + "-" + t.get<std::string>(), path);
        if (!r) return r.error();
        body += (body.empty() ? "" : " | ") + *r;
      }
      return add(hint + "-types", body);
    }
    const std::string t = type.get<std::string>();
    if (t == "string") {
      const int64_t lo = s.value("minLength", int64_t{0});
      const int64_t hi = s.value("maxLength", int64_t{-1});
      if (lo < 0 || lo > 1000 || hi > 1000 || (hi >= 0 && hi < lo))
        return bad(path, "minLength/maxLength must be within 0..1000 and ordered");
      if (lo == 0 && hi < 0) return std::string{"string"};
      const std::string rep = hi < 0 ? "{" + std::to_string(lo) + ",}"
                                     : "{" + std::to_string(lo) + "," + std::to_string(hi) + "}";
      return add(hint + "-string", "\"\\\"\" char" + rep + " \"\\\"\"");
    }
    if (t == "number") return std::string{"number"};
    if (t == "integer") return std::string{"integer"};
    if (t == "boolean") return std::string{"boolean"};
    if (t == "null") return std::string{"null"};
    if (t == "array") return array(s, hint, path);
    if (t == "object") return object(s, hint, path);
    return bad(path, "unknown type '" + t + "'");
  }

  result<std::string> array(const ojson& s, const std::string& hint, const std::string& path) {
    std::vector<std::string> prefix;
    if (s.contains("prefixItems")) {
      size_t i = 0;
      for (const auto& sub : s["prefixItems"]) {
        auto r = visit(sub, hint + "-item" + std::to_string(i),
                       path + "/prefixItems/" + std::to_string(i));
        if (!r) return r.error();
        prefix.push_back(*r);
        ++i;
      }
    }
    std::string item = "value";
    bool closed = false;
    if (s.contains("items")) {
      if (s["items"].is_boolean() && !s["items"].get<bool>()) {
        closed = true;
      } else {
        auto r = visit(s["items"], hint + "-item", path + "/items");
        if (!r) return r.error();
        item = *r;
      }
    }
    const int64_t lo = s.value("minItems", int64_t{0});
    int64_t hi = s.value("maxItems", int64_t{-1});
    if (closed) hi = static_cast<int64_t>(prefix.size());
    if (lo < 0 || lo > 100 || hi > 100 || (hi >= 0 && hi < lo))
      return bad(path, "minItems/maxItems must be within 0..100 and ordered");
    // Elements 0..: the prefix items, then `item`; element k is required when k < lo.
    auto elem = [&](int64_t k) {
      return k < static_cast<int64_t>(prefix.size()) ? prefix[static_cast<size_t>(k)] : item;
    };
    const int64_t fixed = std::max<int64_t>(lo, static_cast<int64_t>(prefix.size()));
    // tail(k): the optional elements from k on, each preceded by a comma.
    std::function<std::string(int64_t)> tail = [&](int64_t k) -> std::string {
      if (hi >= 0 && k >= hi) return "";
      if (k >= fixed && hi < 0) return "( ws \",\" ws " + item + " )*";
      return "( ws \",\" ws " + elem(k) + " " + tail(k + 1) + " )?";
    };
    std::string body;
    if (hi == 0) {
      body = "\"[\" ws \"]\"";
    } else if (lo == 0) {
      body = "\"[\" ws ( " + elem(0) + " " + tail(1) + " )? ws \"]\"";
    } else {
      body = "\"[\" ws " + elem(0);
      for (int64_t k = 1; k < lo; ++k) body += " ws \",\" ws " + elem(k);
      body += " " + tail(lo) + " ws \"]\"";
    }
    return add(hint + "-array", body);
  }

  result<std::string> object(const ojson& s, const std::string& hint, const std::string& path) {
    const auto props = s.value("properties", ojson::object());
    if (!props.is_object()) return bad(path, "properties must be an object");
    if (s.contains("additionalProperties")) {
      const auto& ap = s["additionalProperties"];
      const bool closed = ap.is_boolean() && !ap.get<bool>();
      if (!closed && !props.empty())
        return bad(path,
                   "unsupported JSON Schema keyword 'additionalProperties' other than false beside "
                   "properties");
    }
    if (props.empty()) return std::string{"object"};
    std::set<std::string> required;
    if (s.contains("required")) {
      for (const auto& r : s["required"]) required.insert(r.get<std::string>());
    }
    for (const auto& r : required) {
      if (!props.contains(r))
        return bad(path, "required property '" + r + "' is not in properties");
    }
    std::vector<std::string> req, opt;
    for (const auto& [key, sub] : props.items()) {
      auto r = visit(sub, hint + "-" + key, path + "/properties/" + key);
      if (!r) return r.error();
      const std::string kv = literal(ojson(key).dump()) + " ws \":\" ws " + *r;
      (required.count(key) != 0 ? req : opt).push_back(kv);
    }
    std::string body = "\"{\" ws ";
    if (!req.empty()) {
      for (size_t i = 0; i < req.size(); ++i) body += (i == 0 ? "" : " ws \",\" ws ") + req[i];
      for (const auto& o : opt) body += " ( ws \",\" ws " + o + " )?";
    } else {
      // No required property: any ordered subset of the optional ones.
      std::string alts;
      for (size_t k = 0; k < opt.size(); ++k) {
        std::string a = opt[k];
        for (size_t j = k + 1; j < opt.size(); ++j) a += " ( ws \",\" ws " + opt[j] + " )?";
        alts += (alts.empty() ? "" : " | ") + ("( " + a + " )");
      }
      body += "( " + alts + " )?";
    }
    body += " ws \"}\"";
    return add(hint + "-object", body);
  }

  const ojson& root_;
  std::vector<std::pair<std::string, std::string>> rules_;
  std::set<std::string> used_{"root",   "value",   "object",  "array", "string", "char",
                              "number", "integer", "boolean", "null",  "ws"};
  std::map<std::string, std::string> refs_;
  int depth_ = 0;
};

}  // namespace

result<std::string> json_schema_to_gbnf(const std::string& schema_json) {
  ojson s;
  try {
    s = ojson::parse(schema_json);
  } catch (const std::exception& e) {
    return status{status_code::invalid_argument,
                  std::string{"json_schema is not JSON: "} + e.what()};
  }
  try {
    return schema_compiler(s).run();
  } catch (const nlohmann::json::exception& e) {
    return status{status_code::invalid_argument, std::string{"json_schema: "} + e.what()};
  }
}

}  // namespace weft::gpu::grammar
