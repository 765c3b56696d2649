#include "json.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace lb {

bool Json::as_bool() const {
    if (type_ != Type::Bool) throw std::runtime_error("expected a boolean");
    return bool_;
}
double Json::as_number() const {
    if (type_ != Type::Number) throw std::runtime_error("expected a number");
    return num_;
}
int64_t Json::as_int() const {
    if (type_ != Type::Number || std::floor(num_) != num_ || std::fabs(num_) > 9007199254740992.0)
        throw std::runtime_error("expected an integer");
    return int64_t(num_);
}
const std::string& Json::as_string() const {
    if (type_ != Type::String) throw std::runtime_error("expected a string");
    return str_;
}
const std::vector<Json>& Json::items() const {
    if (type_ != Type::Array) throw std::runtime_error("expected an array");
    return arr_;
}
const std::vector<std::pair<std::string, Json>>& Json::members() const {
    if (type_ != Type::Object) throw std::runtime_error("expected an object");
    return obj_;
}
const Json* Json::get(const std::string& key) const {
    if (type_ != Type::Object) return nullptr;
    for (auto& kv : obj_) if (kv.first == key) return &kv.second;
    return nullptr;
}
Json& Json::operator[](const std::string& key) {
    if (type_ == Type::Null) type_ = Type::Object;
    if (type_ != Type::Object) throw std::runtime_error("not an object");
    for (auto& kv : obj_) if (kv.first == key) return kv.second;
    obj_.emplace_back(key, Json());
    return obj_.back().second;
}
void Json::push_back(Json v) {
    if (type_ == Type::Null) type_ = Type::Array;
    if (type_ != Type::Array) throw std::runtime_error("not an array");
    arr_.push_back(std::move(v));
}
size_t Json::size() const { return type_ == Type::Array ? arr_.size() : type_ == Type::Object ? obj_.size() : 0; }

static void dump_string(const std::string& s, std::string& out) {
    out += '"';
    for (unsigned char c : s) {
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            default:
                if (c < 0x20) { char buf[8]; snprintf(buf, sizeof buf, "\\u%04x", c); out += buf; }
                else out += char(c);
        }
    }
    out += '"';
}

void Json::dump_to(std::string& out) const {
    switch (type_) {
        case Type::Null: out += "null"; break;
        case Type::Bool: out += bool_ ? "true" : "false"; break;
        case Type::Number: {
            char buf[32];
            if (!std::isfinite(num_)) { out += "null"; break; }  // JSON has no inf/nan
            if (std::floor(num_) == num_ && std::fabs(num_) < 1e15) snprintf(buf, sizeof buf, "%lld", (long long)num_);
            else snprintf(buf, sizeof buf, "%.9g", num_);
            out += buf;
            break;
        }
        case Type::String: dump_string(str_, out); break;
        case Type::Array:
            out += '[';
            for (size_t i = 0; i < arr_.size(); ++i) { if (i) out += ','; arr_[i].dump_to(out); }
            out += ']';
            break;
        case Type::Object:
            out += '{';
            for (size_t i = 0; i < obj_.size(); ++i) {
                if (i) out += ',';
                dump_string(obj_[i].first, out);
                out += ':';
                obj_[i].second.dump_to(out);
            }
            out += '}';
            break;
    }
}

std::string Json::dump() const { std::string s; dump_to(s); return s; }

namespace {
struct Parser {
    const std::string& s;
    size_t i = 0;
    [[noreturn]] void error(const char* what) {
        throw std::runtime_error(std::string("invalid JSON at offset ") + std::to_string(i) + ": " + what);
    }
    void ws() { while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) ++i; }
    bool lit(const char* w) {
        size_t n = strlen(w);
        if (s.compare(i, n, w) == 0) { i += n; return true; }
        return false;
    }
    static void put_utf8(std::string& out, uint32_t cp) {
        if (cp < 0x80) out += char(cp);
        else if (cp < 0x800) { out += char(0xC0 | (cp >> 6)); out += char(0x80 | (cp & 0x3F)); }
        else if (cp < 0x10000) { out += char(0xE0 | (cp >> 12)); out += char(0x80 | ((cp >> 6) & 0x3F)); out += char(0x80 | (cp & 0x3F)); }
        else { out += char(0xF0 | (cp >> 18)); out += char(0x80 | ((cp >> 12) & 0x3F)); out += char(0x80 | ((cp >> 6) & 0x3F)); out += char(0x80 | (cp & 0x3F)); }
    }
    uint32_t hex4() {
        if (i + 4 > s.size()) error("short \\u escape");
        uint32_t v = 0;
        for (int k = 0; k < 4; ++k) {
            char c = s[i++];
            v <<= 4;
            if (c >= '0' && c <= '9') v |= c - '0';
            else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
            else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
            else error("bad \\u escape");
        }
        return v;
    }
    std::string str() {
        if (s[i] != '"') error("expected a string");
        ++i;
        std::string out;
        while (true) {
            if (i >= s.size()) error("unterminated string");
            char c = s[i++];
            if (c == '"') break;
            if (c != '\\') { out += c; continue; }
            if (i >= s.size()) error("unterminated escape");
            char e = s[i++];
            switch (e) {
                case '"': out += '"'; break;
                case '\\': out += '\\'; break;
                case '/': out += '/'; break;
                case 'b': out += '\b'; break;
                case 'f': out += '\f'; break;
                case 'n': out += '\n'; break;
                case 'r': out += '\r'; break;
                case 't': out += '\t'; break;
                case 'u': {
                    uint32_t cp = hex4();
                    if (cp >= 0xD800 && cp < 0xDC00 && s.compare(i, 2, "\\u") == 0) {
                        i += 2;
                        uint32_t lo = hex4();
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    }
                    put_utf8(out, cp);
                    break;
                }
                default: error("bad escape");
            }
        }
        return out;
    }
    Json value(int depth) {
        if (depth > 200) error("nesting too deep");
        ws();
        if (i >= s.size()) error("unexpected end");
        char c = s[i];
        if (c == '{') {
            ++i;
            Json o = Json::object();
            ws();
            if (i < s.size() && s[i] == '}') { ++i; return o; }
            while (true) {
                ws();
                if (i >= s.size()) error("unexpected end");
                std::string k = str();
                ws();
                if (i >= s.size() || s[i] != ':') error("expected ':'");
                ++i;
                o[k] = value(depth + 1);
                ws();
                if (i < s.size() && s[i] == ',') { ++i; continue; }
                if (i < s.size() && s[i] == '}') { ++i; return o; }
                error("expected ',' or '}'");
            }
        }
        if (c == '[') {
            ++i;
            Json a = Json::array();
            ws();
            if (i < s.size() && s[i] == ']') { ++i; return a; }
            while (true) {
                a.push_back(value(depth + 1));
                ws();
                if (i < s.size() && s[i] == ',') { ++i; continue; }
                if (i < s.size() && s[i] == ']') { ++i; return a; }
                error("expected ',' or ']'");
            }
        }
        if (c == '"') return Json(str());
        if (lit("true")) return Json(true);
        if (lit("false")) return Json(false);
        if (lit("null")) return Json();
        if (lit("NaN")) return Json(std::nan(""));  // Python's json writes these; accept on input only
        if (lit("Infinity")) return Json(HUGE_VAL);
        if (lit("-Infinity")) return Json(-HUGE_VAL);
        if (c == '-' || (c >= '0' && c <= '9')) {
            const char* begin = s.c_str() + i;
            char* end = nullptr;
            double d = strtod(begin, &end);
            if (end == begin) error("bad number");
            i += size_t(end - begin);
            return Json(d);
        }
        error("unexpected character");
    }
};
}  // namespace

Json Json::parse(const std::string& text) {
    Parser p{text};
    Json v = p.value(0);
    p.ws();
    if (p.i != text.size()) p.error("trailing characters");
    return v;
}

}  // namespace lb
