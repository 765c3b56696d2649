// A small JSON value with a parser and a writer: enough for the JSON-lines protocol and config.json.
// Numbers are doubles (token ids and sizes fit exactly below 2^53).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace lb {

class Json {
public:
    enum class Type { Null, Bool, Number, String, Array, Object };

    Json() = default;
    Json(std::nullptr_t) {}
    Json(bool b) : type_(Type::Bool), bool_(b) {}
    Json(double d) : type_(Type::Number), num_(d) {}
    Json(int v) : type_(Type::Number), num_(v) {}
    Json(int64_t v) : type_(Type::Number), num_(double(v)) {}
    Json(uint64_t v) : type_(Type::Number), num_(double(v)) {}
    Json(const char* s) : type_(Type::String), str_(s) {}
    Json(std::string s) : type_(Type::String), str_(std::move(s)) {}
    static Json array() { Json j; j.type_ = Type::Array; return j; }
    static Json object() { Json j; j.type_ = Type::Object; return j; }

    Type type() const { return type_; }
    bool is_null() const { return type_ == Type::Null; }
    bool is_bool() const { return type_ == Type::Bool; }
    bool is_number() const { return type_ == Type::Number; }
    bool is_string() const { return type_ == Type::String; }
    bool is_array() const { return type_ == Type::Array; }
    bool is_object() const { return type_ == Type::Object; }

    bool as_bool() const;
    double as_number() const;
    int64_t as_int() const;  // throws unless an integral number
    const std::string& as_string() const;
    const std::vector<Json>& items() const;  // array elements
    const std::vector<std::pair<std::string, Json>>& members() const;  // object members, in order

    // Object access. `get` returns nullptr when absent.
    const Json* get(const std::string& key) const;
    Json& operator[](const std::string& key);  // inserts (object only)
    void push_back(Json v);                    // array only
    size_t size() const;

    std::string dump() const;  // compact, one line
    static Json parse(const std::string& text);  // throws std::runtime_error with the offset

private:
    void dump_to(std::string& out) const;
    Type type_ = Type::Null;
    bool bool_ = false;
    double num_ = 0;
    std::string str_;
    std::vector<Json> arr_;
    std::vector<std::pair<std::string, Json>> obj_;
};

}  // namespace lb
