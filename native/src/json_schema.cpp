// JSON schemas as grammars, by llama.cpp's own converter (common/json-schema-to-grammar.cpp,
// compiled from the llama.cpp source that llama-cpp-python's sdist vendors).
#include "cospec.h"
#include "internal.h"

#include "json-schema-to-grammar.h"

#include <exception>
#include <string>

extern "C" const char * cospec_json_schema_to_grammar(const char * schema_json, const char * rule_name,
                                                      const char * root_rule) {
    cospec::clear_error();
    thread_local std::string grammar;
    if (schema_json == nullptr) {
        cospec::fail(COSPEC_ERR_INVALID_ARGUMENT, "cospec_json_schema_to_grammar: the schema is NULL");
        return nullptr;
    }
    const bool named = rule_name != nullptr && rule_name[0] != '\0' && std::string(rule_name) != "root";
    if (named && (root_rule == nullptr || root_rule[0] == '\0')) {
        cospec::fail(COSPEC_ERR_INVALID_ARGUMENT, "cospec_json_schema_to_grammar: a named rule needs a root rule");
        return nullptr;
    }
    try {
        const common_chat_schema_document document = common_chat_schema_from_json(common_json::parse(schema_json));
        if (!named) {
            grammar = json_schema_to_grammar(document);
            return grammar.c_str();
        }
        std::string given;
        grammar = build_grammar([&](const common_grammar_builder & builder) {
            given = builder.add_schema(rule_name, *document.root);
            builder.add_rule("root", root_rule);
        });
        if (given != rule_name) {
            cospec::fail(COSPEC_ERR_INVALID_ARGUMENT, std::string("the rule name '") + rule_name +
                                                          "' is not a GBNF rule name (letters, digits and '-')");
            return nullptr;
        }
        return grammar.c_str();
    } catch (const std::exception & ex) {
        cospec::fail(COSPEC_ERR_INVALID_ARGUMENT, std::string("the JSON schema cannot be turned into a grammar: ") + ex.what());
    } catch (...) {
        cospec::fail(COSPEC_ERR_INVALID_ARGUMENT, "the JSON schema cannot be turned into a grammar");
    }
    return nullptr;
}
