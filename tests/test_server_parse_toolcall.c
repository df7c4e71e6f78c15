/* test_server_parse_toolcall.c - tool calls (src/chat/toolcall.c) and
 * the incremental JSON validator behind them.
 *
 * The corpus follows the public format examples: Hermes / Qwen3 JSON calls
 * ("<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>", as in the
 * Qwen function-calling guide's get_current_temperature / get_temperature_date
 * example) and the Qwen3-Coder / Qwen3.5 XML form
 * ("<tool_call>\n<function=NAME>\n<parameter=P>\nvalue\n</parameter>\n...").
 * The strings are written here, not copied. Every case runs through the
 * chunking harness (test_server_parse_harness.c) in streaming and atomic mode.
 * Beyond the corpus: the assistant turns that the Qwen3 and Qwen3.8 chat
 * templates themselves render (../shared/fixtures) must parse back into their
 * messages, and generated and random inputs must be chunking-independent. */
#include "test_server_parse.h"
#include "test_util.h"

#include "chat/lm_parse.h"
#include "chat/parse_internal.h"

#include <stdlib.h>
#include <string.h>

static const char TOOLS[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_current_temperature\","
    "  \"description\": \"Get current temperature at a location.\","
    "  \"parameters\": {\"type\": \"object\", \"properties\": {\"location\": {\"type\": \"string\"},"
    "   \"unit\": {\"type\": \"string\", \"enum\": [\"celsius\", \"fahrenheit\"]}}, \"required\": [\"location\"]}}},"
    " {\"type\": \"function\", \"function\": {\"name\": \"get_temperature_date\","
    "  \"parameters\": {\"type\": \"object\", \"properties\": {\"location\": {\"type\": \"string\"},"
    "   \"date\": {\"type\": \"string\"}, \"unit\": {\"type\": \"string\"}}}}},"
    " {\"type\": \"function\", \"function\": {\"name\": \"write_file\","
    "  \"parameters\": {\"type\": \"object\", \"properties\": {\"path\": {\"type\": \"string\"},"
    "   \"content\": {\"type\": \"string\"}, \"overwrite\": {\"type\": \"boolean\"}}}}},"
    " {\"type\": \"function\", \"function\": {\"name\": \"search_products\","
    "  \"parameters\": {\"type\": \"object\", \"properties\": {\"query\": {\"type\": \"string\"},"
    "   \"max_results\": {\"type\": \"integer\"}, \"min_rating\": {\"type\": \"number\"},"
    "   \"in_stock\": {\"type\": \"boolean\"}, \"filters\": {\"type\": \"object\"},"
    "   \"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}},"
    "   \"cursor\": {\"type\": [\"string\", \"null\"]}, \"sort\": {\"enum\": [\"price\", \"rating\"]},"
    "   \"page\": {\"anyOf\": [{\"type\": \"integer\"}, {\"type\": \"null\"}]}}}}},"
    " {\"type\": \"function\", \"function\": {\"name\": \"run_python\","
    "  \"parameters\": {\"type\": \"object\", \"properties\": {\"code\": {\"type\": \"string\"},"
    "   \"timeout\": {\"type\": \"integer\"}}}}}]";

static const char *const STOP_CLOSE[] = { "</tool_call>", NULL };
static const char *const STOP_OPEN[] = { "<tool_call>", NULL };
static const char *const STOP_FUNC_END[] = { "</function>", NULL };

/* ---- Hermes / Qwen3 JSON form --------------------------------------------------- */

static const pp_case JSON_CASES[] = {
    {
        .name = "json single call",
        .text = "<tool_call>\n{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"San Francisco, CA, USA\"}}\n</tool_call>",
        .tools = true, .tools_json = TOOLS,
        .content = "",
        .calls = "[{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"San Francisco, CA, USA\"}}]",
        .args_exact = "{\"location\": \"San Francisco, CA, USA\"}",
    },
    {
        .name = "json two calls after content",
        .text = "I'll look up the current and tomorrow's temperature.\n\n"
                "<tool_call>\n{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"San Francisco, CA, USA\", \"unit\": \"celsius\"}}\n</tool_call>\n"
                "<tool_call>\n{\"name\": \"get_temperature_date\", \"arguments\": {\"location\": \"San Francisco, CA, USA\", \"date\": \"2024-10-01\", \"unit\": \"celsius\"}}\n</tool_call>",
        .think = true, .tools = true, .tools_json = TOOLS,
        .content = "I'll look up the current and tomorrow's temperature.",
        .calls = "[{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"San Francisco, CA, USA\", \"unit\": \"celsius\"}},"
                 " {\"name\": \"get_temperature_date\", \"arguments\": {\"location\": \"San Francisco, CA, USA\", \"date\": \"2024-10-01\", \"unit\": \"celsius\"}}]",
    },
    {
        .name = "json three calls after reasoning",
        .text = "<think>\nThe user wants the weather in three cities. I'll call get_current_temperature for each.\n</think>\n\n"
                "<tool_call>\n{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"Paris, France\"}}\n</tool_call>\n"
                "<tool_call>\n{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"東京, 日本\"}}\n</tool_call>\n"
                "<tool_call>\n{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"Zürich, Schweiz\", \"unit\": \"celsius\"}}\n</tool_call>",
        .think = true, .tools = true, .tools_json = TOOLS,
        .reasoning = "The user wants the weather in three cities. I'll call get_current_temperature for each.",
        .content = "",
        .calls = "[{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"Paris, France\"}},"
                 " {\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"東京, 日本\"}},"
                 " {\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"Zürich, Schweiz\", \"unit\": \"celsius\"}}]",
    },
    {
        .name = "json call after reasoning opened in the prompt",
        .text = "Need the weather in Oslo; the tool takes a city.\n</think>\n\n"
                "<tool_call>\n{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"Oslo, Norway\", \"unit\": \"celsius\"}}\n</tool_call>",
        .think = true, .think_open = true, .tools = true, .tools_json = TOOLS,
        .reasoning = "Need the weather in Oslo; the tool takes a city.",
        .content = "",
        .calls = "[{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"Oslo, Norway\", \"unit\": \"celsius\"}}]",
    },
    {
        .name = "json nested arguments and escapes",
        .text = "<tool_call>\n{\"name\": \"search_products\", \"arguments\": {\"query\": \"waterproof \\\"trail\\\" shoes \\u2014 size 42\\n\","
                " \"filters\": {\"brand\": [\"Salomon\", \"Hoka\"], \"price\": {\"max\": 150.5, \"min\": -1e2}},"
                " \"max_results\": 10, \"in_stock\": true, \"cursor\": null}}\n</tool_call>",
        .tools = true, .tools_json = TOOLS,
        .content = "",
        .calls = "[{\"name\": \"search_products\", \"arguments\": {\"query\": \"waterproof \\\"trail\\\" shoes \\u2014 size 42\\n\","
                 " \"filters\": {\"brand\": [\"Salomon\", \"Hoka\"], \"price\": {\"max\": 150.5, \"min\": -1e2}},"
                 " \"max_results\": 10, \"in_stock\": true, \"cursor\": null}}]",
        .args_exact = "{\"query\": \"waterproof \\\"trail\\\" shoes \\u2014 size 42\\n\","
                      " \"filters\": {\"brand\": [\"Salomon\", \"Hoka\"], \"price\": {\"max\": 150.5, \"min\": -1e2}},"
                      " \"max_results\": 10, \"in_stock\": true, \"cursor\": null}",
    },
    {
        .name = "json arguments before name, parameters key, tags inside strings",
        .text = "<tool_call>\n{\"arguments\": {\"code\": \"print(1 < 2 > 0)\"}, \"name\": \"run_python\"}\n</tool_call>\n"
                "<tool_call>\n{\"name\": \"run_python\", \"parameters\": {\"code\": \"x = '</tool_call>'\", \"timeout\": 5}}\n</tool_call>",
        .tools = true, .tools_json = TOOLS,
        .content = "",
        .calls = "[{\"name\": \"run_python\", \"arguments\": {\"code\": \"print(1 < 2 > 0)\"}},"
                 " {\"name\": \"run_python\", \"arguments\": {\"code\": \"x = '</tool_call>'\", \"timeout\": 5}}]",
    },
    {
        .name = "json arguments as a string, null and missing",
        .text = "<tool_call>\n{\"name\": \"get_current_temperature\", \"arguments\": \"{\\\"location\\\": \\\"Lima\\\"}\"}\n</tool_call>\n"
                "<tool_call>\n{\"name\": \"get_time\", \"arguments\": null}\n</tool_call>\n"
                "<tool_call>\n{\"name\": \"get_time\"}\n</tool_call>",
        .tools = true, .tools_json = TOOLS,
        .content = "",
        .calls = "[{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"Lima\"}},"
                 " {\"name\": \"get_time\", \"arguments\": {}}, {\"name\": \"get_time\", \"arguments\": {}}]",
        .args_exact = "{\"location\": \"Lima\"}",
    },
    {
        .name = "json two objects in one block",
        .text = "<tool_call>\n{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"Rome\"}}\n"
                "{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"Milan\"}}\n</tool_call>",
        .tools = true, .tools_json = TOOLS,
        .content = "",
        .calls = "[{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"Rome\"}},"
                 " {\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"Milan\"}}]",
    },
    {
        .name = "json call then text",
        .text = "<tool_call>\n{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"Cairo\"}}\n</tool_call>\n\n"
                "I have asked for the temperature; waiting for the result.",
        .tools = true,
        .content = "I have asked for the temperature; waiting for the result.",
        .calls = "[{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"Cairo\"}}]",
    },
    {
        .name = "json malformed: missing brace",
        .text = "Checking.\n\n<tool_call>\n{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"Paris\"}\n</tool_call>\nDone.",
        .tools = true, .tools_json = TOOLS,
        .content = "Checking.\n\n<tool_call>\n{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"Paris\"}\n</tool_call>\nDone.",
        .partial = 1, .tags_in_content = true,
    },
    {
        .name = "json malformed literal, then a good call",
        .text = "<tool_call>\n{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"Paris\", \"verbose\": tru}}\n</tool_call>\n"
                "<tool_call>\n{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"Lyon\"}}\n</tool_call>",
        .tools = true, .tools_json = TOOLS,
        .content = "<tool_call>\n{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"Paris\", \"verbose\": tru}}\n</tool_call>",
        .calls = "[{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"Lyon\"}}]",
        .partial = 1, .tags_in_content = true,
    },
    {
        .name = "json call without a name",
        .text = "<tool_call>\n{\"arguments\": {\"location\": \"Paris\"}, \"name\": 7}\n</tool_call>",
        .tools = true,
        .content = "<tool_call>\n{\"arguments\": {\"location\": \"Paris\"}, \"name\": 7}\n</tool_call>",
        .tags_in_content = true,
    },
    {
        .name = "json call unclosed at the end",
        .text = "Let me check.\n<tool_call>\n{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"Par",
        .tools = true, .tools_json = TOOLS,
        .content = "Let me check.\n<tool_call>\n{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"Par",
        .partial = 1, .tags_in_content = true,
    },
    {
        .name = "stop string on the close tag",
        .text = "<tool_call>\n{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"Nairobi\"}}\n</tool_call>\n"
                "<tool_call>\n{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"Accra\"}}\n</tool_call>",
        .stops = STOP_CLOSE, .think = true, .tools = true, .tools_json = TOOLS,
        .content = "",
        .calls = "[{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"Nairobi\"}}]",
        .stopped = true,
    },
    {
        .name = "stop string on the open tag",
        .text = "Let me check that.\n<tool_call>\n{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"Quito\"}}\n</tool_call>",
        .stops = STOP_OPEN, .think = true, .tools = true, .tools_json = TOOLS,
        .content = "Let me check that.\n",
        .stopped = true,
    },
    {
        .name = "tool_call tags that are text",
        .text = "Models write <tool_call> then JSON; here <tool_call>{oops} and </tool_call> are just text.",
        .tools = true,
        .content = "Models write <tool_call> then JSON; here <tool_call>{oops} and </tool_call> are just text.",
        .tags_in_content = true,
    },
};

LM_TEST(parse_toolcall_json_corpus) {
    for (size_t i = 0; i < LM_COUNT(JSON_CASES); i++) PP_CHECK_CASE(&JSON_CASES[i]);
}

/* ---- Qwen3-Coder / Qwen3.5 XML form ---------------------------------------------- */

static const pp_case XML_CASES[] = {
    {
        .name = "xml single call",
        .text = "<tool_call>\n<function=search_products>\n<parameter=query>\nwaterproof running shoes\n</parameter>\n"
                "<parameter=sort>\nprice\n</parameter>\n</function>\n</tool_call>",
        .tools = true, .tools_json = TOOLS,
        .content = "",
        .calls = "[{\"name\": \"search_products\", \"arguments\": {\"query\": \"waterproof running shoes\", \"sort\": \"price\"}}]",
        .args_exact = "{\"query\": \"waterproof running shoes\", \"sort\": \"price\"}",
    },
    {
        .name = "xml typed parameters",
        .text = "<tool_call>\n<function=search_products>\n"
                "<parameter=query>\n  trail shoes  \n</parameter>\n"
                "<parameter=max_results>\n5\n</parameter>\n"
                "<parameter=min_rating>\n4.5\n</parameter>\n"
                "<parameter=in_stock>\nTrue\n</parameter>\n"
                "<parameter=filters>\n{\"brand\": [\"Salomon\", \"Hoka\"],\n \"price\": {\"max\": 150}}\n</parameter>\n"
                "<parameter=tags>\n[\"trail\", \"waterproof\"]\n</parameter>\n"
                "<parameter=cursor>\nnull\n</parameter>\n"
                "<parameter=page>\n2\n</parameter>\n"
                "</function>\n</tool_call>",
        .tools = true, .tools_json = TOOLS,
        .content = "",
        .calls = "[{\"name\": \"search_products\", \"arguments\": {\"query\": \"  trail shoes  \", \"max_results\": 5,"
                 " \"min_rating\": 4.5, \"in_stock\": true, \"filters\": {\"brand\": [\"Salomon\", \"Hoka\"], \"price\": {\"max\": 150}},"
                 " \"tags\": [\"trail\", \"waterproof\"], \"cursor\": null, \"page\": 2}}]",
        .args_exact = "{\"query\": \"  trail shoes  \", \"max_results\": 5, \"min_rating\": 4.5, \"in_stock\": true,"
                      " \"filters\": {\"brand\": [\"Salomon\", \"Hoka\"],\n \"price\": {\"max\": 150}},"
                      " \"tags\": [\"trail\", \"waterproof\"], \"cursor\": null, \"page\": 2}",
    },
    {
        .name = "xml two calls with content before",
        .text = "Let me look up both cities.\n\n"
                "<tool_call>\n<function=get_current_temperature>\n<parameter=location>\n東京タワー, Tokyo 🗼\n</parameter>\n</function>\n</tool_call>\n"
                "<tool_call>\n<function=get_current_temperature>\n<parameter=location>\nZürich, Switzerland\n</parameter>\n"
                "<parameter=unit>\ncelsius\n</parameter>\n</function>\n</tool_call>",
        .think = true, .tools = true, .tools_json = TOOLS,
        .content = "Let me look up both cities.",
        .calls = "[{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"東京タワー, Tokyo 🗼\"}},"
                 " {\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"Zürich, Switzerland\", \"unit\": \"celsius\"}}]",
    },
    {
        .name = "xml call after reasoning opened in the prompt",
        .text = "The user asks to run code. I'll use run_python.\n</think>\n\n"
                "<tool_call>\n<function=run_python>\n<parameter=code>\nfor i in range(3):\n    print(i, i < 2, \"<done>\", i >= 1)\n</parameter>\n"
                "<parameter=timeout>\n30\n</parameter>\n</function>\n</tool_call>",
        .think = true, .think_open = true, .tools = true, .tools_json = TOOLS,
        .reasoning = "The user asks to run code. I'll use run_python.",
        .content = "",
        .calls = "[{\"name\": \"run_python\", \"arguments\": {\"code\": \"for i in range(3):\\n    print(i, i < 2, \\\"<done>\\\", i >= 1)\", \"timeout\": 30}}]",
        .args_exact = "{\"code\": \"for i in range(3):\\n    print(i, i < 2, \\\"<done>\\\", i >= 1)\", \"timeout\": 30}",
    },
    {
        .name = "xml call inside an unclosed think block (implicit end)",
        .text = "I need the weather in Paris.\n\n<tool_call>\n<function=get_current_temperature>\n<parameter=location>\nParis, France\n"
                "</parameter>\n</function>\n</tool_call>",
        .think = true, .think_open = true, .think_implicit = "<tool_call>", .tools = true, .tools_json = TOOLS,
        .reasoning = "I need the weather in Paris.",
        .content = "",
        .calls = "[{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"Paris, France\"}}]",
    },
    {
        .name = "xml unknown tool and parameters",
        .text = "<tool_call>\n<function=lookup>\n<parameter=count>\n3\n</parameter>\n<parameter=label>\nhello world\n</parameter>\n"
                "<parameter=opts>\n{\"deep\": true}\n</parameter>\n<parameter=quoted>\n\"x\"\n</parameter>\n</function>\n</tool_call>",
        .tools = true, .tools_json = TOOLS,
        .content = "",
        .calls = "[{\"name\": \"lookup\", \"arguments\": {\"count\": 3, \"label\": \"hello world\", \"opts\": {\"deep\": true}, \"quoted\": \"x\"}}]",
    },
    {
        .name = "xml values that do not fit their type",
        .text = "<tool_call>\n<function=search_products>\n<parameter=max_results>\nfive\n</parameter>\n<parameter=in_stock>\nyes\n</parameter>\n"
                "<parameter=filters>\nnot json\n</parameter>\n<parameter=min_rating>\n4,5\n</parameter>\n<parameter=tags>\n{\"a\": 1}\n</parameter>\n"
                "</function>\n</tool_call>",
        .tools = true, .tools_json = TOOLS,
        .content = "",
        .calls = "[{\"name\": \"search_products\", \"arguments\": {\"max_results\": \"five\", \"in_stock\": \"yes\", \"filters\": \"not json\","
                 " \"min_rating\": \"4,5\", \"tags\": \"{\\\"a\\\": 1}\"}}]",
    },
    {
        .name = "xml value on one line, empty value, no tools given",
        .text = "<tool_call>\n<function=get_current_temperature>\n<parameter=location>Paris</parameter>\n"
                "<parameter=unit>\n\n</parameter>\n</function>\n</tool_call>",
        .tools = true,
        .content = "",
        .calls = "[{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"Paris\", \"unit\": \"\"}}]",
    },
    {
        .name = "xml no parameters",
        .text = "<tool_call>\n<function=get_time>\n</function>\n</tool_call>",
        .tools = true, .tools_json = TOOLS,
        .content = "",
        .calls = "[{\"name\": \"get_time\", \"arguments\": {}}]",
        .args_exact = "{}",
    },
    {
        .name = "xml unclosed function at the end",
        .text = "<tool_call>\n<function=get_current_temperature>\n<parameter=location>\nParis\n</parameter>\n",
        .tools = true, .tools_json = TOOLS,
        .content = "<tool_call>\n<function=get_current_temperature>\n<parameter=location>\nParis\n</parameter>\n",
        .partial = 1, .tags_in_content = true,
    },
    {
        .name = "xml malformed parameter tag",
        .text = "<tool_call>\n<function=get_current_temperature>\n<param=location>\nParis\n</param>\n</function>\n</tool_call>",
        .tools = true, .tools_json = TOOLS,
        .content = "<tool_call>\n<function=get_current_temperature>\n<param=location>\nParis\n</param>\n</function>\n</tool_call>",
        .partial = 1, .tags_in_content = true,
    },
    {
        .name = "xml parameter never closed",
        .text = "Writing.\n<tool_call>\n<function=write_file>\n<parameter=content>\nint x = 1;\nint y = x < 2;\n</parameter",
        .tools = true, .tools_json = TOOLS,
        .content = "Writing.\n<tool_call>\n<function=write_file>\n<parameter=content>\nint x = 1;\nint y = x < 2;\n</parameter",
        .partial = 1, .tags_in_content = true,
    },
    {
        .name = "xml function name with a newline is not a call",
        .text = "<tool_call>\n<function=get\ntime>\n</function>\n</tool_call>",
        .tools = true, .tools_json = TOOLS,
        .content = "<tool_call>\n<function=get\ntime>\n</function>\n</tool_call>",
        .tags_in_content = true,
    },
    {
        .name = "stop string inside an xml call",
        .text = "<tool_call>\n<function=get_current_temperature>\n<parameter=location>\nParis\n</parameter>\n</function>\n</tool_call>",
        .stops = STOP_FUNC_END, .tools = true, .tools_json = TOOLS,
        .content = "<tool_call>\n<function=get_current_temperature>\n<parameter=location>\nParis\n</parameter>\n",
        .stopped = true, .partial = 1, .tags_in_content = true,
    },
};

LM_TEST(parse_toolcall_xml_corpus) {
    for (size_t i = 0; i < LM_COUNT(XML_CASES); i++) PP_CHECK_CASE(&XML_CASES[i]);
}

/* A file write whose content is C code full of '<', '>' and near-tags. */
static const char CODE[] =
    "#include <stdio.h>\n"
    "#include <string.h>\n"
    "\n"
    "/* <0, 0 or >0; not tags: </param> </parameter > <parameter=x> </function> */\n"
    "static int cmp(const char *a, const char *b) {\n"
    "    if (!a || !b) return (a != NULL) - (b != NULL);\n"
    "    return strcmp(a, b) < 0 ? -1 : strcmp(a, b) > 0;\n"
    "}\n"
    "\n"
    "int main(void) {\n"
    "    printf(\"%d\\n\", cmp(\"a\", \"b\")); // -1 <-> \"ok\" \xE2\x9C\x93\n"
    "    return 0;\n"
    "}\n";

LM_TEST(parse_toolcall_xml_code_string) {
    char *text = NULL, *calls = NULL;
    size_t tn = 0;
    FILE *f = open_memstream(&text, &tn);
    fprintf(f, "I'll write the file.\n\n<tool_call>\n<function=write_file>\n<parameter=path>\nsrc/cmp.c\n</parameter>\n"
               "<parameter=content>\n%s\n</parameter>\n<parameter=overwrite>\nfalse\n</parameter>\n</function>\n</tool_call>",
            CODE);
    fclose(f);
    json_t *want = json_pack("[{s:s, s:{s:s, s:s, s:b}}]", "name", "write_file", "arguments", "path", "src/cmp.c",
                             "content", CODE, "overwrite", 0);
    calls = json_dumps(want, 0);
    json_decref(want);
    pp_case c = {
        .name = "xml multi-line code string",
        .text = text, .think = true, .tools = true, .tools_json = TOOLS,
        .content = "I'll write the file.",
        .calls = calls,
    };
    PP_CHECK_CASE(&c);
    free(text);
    free(calls);
}

/* ---- the templates' own renderings ------------------------------------------------- */

/* Every assistant turn in the Qwen3 (JSON calls) and Qwen3.8 (XML calls)
 * template fixtures, as the reference Jinja engine rendered it, must parse
 * back into the message it came from: content, reasoning and tool calls. */
static int roundtrip_case(lm_test_ctx *lm_t_, const char *file, const json_t *cs) {
    const json_t *ctx = json_object_get(cs, "context");
    const char *expected = json_string_value(json_object_get(cs, "expected"));
    const json_t *msgs = json_object_get(ctx, "messages");
    if (!expected || !json_is_array(msgs)) return 0;
    const char *open = "<|im_start|>assistant\n", *close = "<|im_end|>";
    const char *segs[16];
    size_t lens[16];
    int nseg = 0;
    for (const char *q = expected; (q = strstr(q, open)) && nseg < 16;) {
        q += strlen(open);
        const char *end = strstr(q, close);
        if (!end) break; /* the generation prompt */
        segs[nseg] = q;
        lens[nseg++] = (size_t)(end - q);
        q = end;
    }
    char *tools = json_object_get(ctx, "tools") ? json_dumps(json_object_get(ctx, "tools"), 0) : NULL;
    int turns = 0;
    size_t i;
    const json_t *m;
    json_array_foreach(msgs, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!role || strcmp(role, "assistant") != 0) continue;
        if (turns >= nseg) break;
        char *text = strndup(segs[turns], lens[turns]);
        const char *content = json_string_value(json_object_get(m, "content"));
        const char *reasoning = json_string_value(json_object_get(m, "reasoning_content"));
        json_t *calls = json_array();
        size_t k;
        const json_t *tc;
        json_array_foreach(json_object_get(m, "tool_calls"), k, tc) {
            const json_t *fn = json_object_get(tc, "function");
            json_t *args = json_deep_copy(json_object_get(fn, "arguments"));
            if (json_is_string(args)) {
                json_t *parsed = json_loads(json_string_value(args), 0, NULL);
                json_decref(args);
                args = parsed;
            }
            json_array_append_new(calls, json_pack("{s:O, s:o}", "name", json_object_get(fn, "name"), "arguments",
                                                   args ? args : json_object()));
        }
        char *calls_s = json_dumps(calls, 0);
        char name[160];
        snprintf(name, sizeof name, "%s %s turn %d", file, json_string_value(json_object_get(cs, "id")), turns);
        /* the Qwen3.8 template renders content|trim: that is what a model sees and writes */
        char *want = strdup(content ? content : "");
        if (strstr(file, "qwen38")) {
            size_t a = 0, b = strlen(want);
            while (a < b && strchr(" \t\n\r", want[a])) a++;
            while (b > a && strchr(" \t\n\r", want[b - 1])) b--;
            memmove(want, want + a, b - a);
            want[b - a] = 0;
        }
        pp_case c = {
            .name = name, .text = text, .think = true, .tools = true, .tools_json = tools,
            .content = want,
            .reasoning = strstr(text, "<think>") && reasoning ? reasoning : "",
            .calls = calls_s,
        };
        PP_CHECK_CASE(&c);
        free(calls_s);
        json_decref(calls);
        free(text);
        free(want);
        turns++;
    }
    free(tools);
    return turns;
}

LM_TEST(parse_template_renderings_roundtrip) {
    if (!lm_test_fixtures()) LM_SKIP("%s", lm_test_fixtures_why());
    static const char *const files[] = { "templates/qwen3/cases.jsonl", "templates/qwen38/cases.jsonl" };
    int turns = 0, calls = 0;
    for (size_t f = 0; f < LM_COUNT(files); f++) {
        char *path = lm_test_fixture_path(files[f]);
        size_t n;
        char *data = lm_tu_read(path, &n);
        free(path);
        if (!data) LM_SKIP("fixture %s not found", files[f]);
        for (char *line = data, *next; line && *line; line = next) {
            next = strchr(line, '\n');
            if (next) *next++ = 0;
            json_t *cs = json_loads(line, 0, NULL);
            if (!cs) continue;
            calls += strstr(line, "\"tool_calls\"") != NULL;
            turns += roundtrip_case(lm_t_, files[f], cs);
            json_decref(cs);
        }
        free(data);
    }
    LM_CHECK_MSG(turns >= 10 && calls >= 6, "%d assistant turns, %d cases with tool calls", turns, calls);
}

/* ---- unit tests: what is emitted when ------------------------------------------------ */

typedef struct tsnap {
    char content[512];
    char args[512];
    int n_calls;
    int index;
    char name[64];
    bool has_id;
} tsnap;

static void tfeed(lm_toolcall_parser *p, const char *s, tsnap *o) {
    lm_toolcall_out out;
    lm_toolcall_parser_feed(p, s, strlen(s), &out);
    memset(o, 0, sizeof *o);
    snprintf(o->content, sizeof o->content, "%s", out.content);
    o->n_calls = out.n_calls;
    o->index = -1;
    if (out.n_calls) {
        o->index = out.calls[0].index;
        o->has_id = out.calls[0].id != NULL;
        snprintf(o->name, sizeof o->name, "%s", out.calls[0].name ? out.calls[0].name : "");
        snprintf(o->args, sizeof o->args, "%s", out.calls[0].args);
    }
}

LM_TEST(parse_toolcall_content_holdback) {
    lm_toolcall_parser *p = lm_toolcall_parser_create(NULL, NULL);
    tsnap o;
    tfeed(p, "Hello <tool", &o);
    LM_CHECK(strcmp(o.content, "Hello") == 0); /* " <tool" may be framing + tag */
    tfeed(p, "s> and more  ", &o);
    LM_CHECK(strcmp(o.content, " <tools> and more") == 0); /* trailing spaces: maybe framing */
    tfeed(p, "\n<tool_call>\n", &o);
    LM_CHECK(o.content[0] == 0 && o.n_calls == 0);
    tfeed(p, "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa", &o);
    /* the name, then the arguments as far as they are valid JSON */
    LM_CHECK(o.n_calls == 1 && o.index == 0 && o.has_id && strcmp(o.name, "get_weather") == 0);
    LM_CHECK(strcmp(o.args, "{\"city\": \"Pa") == 0);
    tfeed(p, "ris\"}}\n</tool_call>\n\nOk", &o);
    LM_CHECK(o.n_calls == 1 && !o.has_id && o.name[0] == 0 && strcmp(o.args, "ris\"}") == 0);
    LM_CHECK(strcmp(o.content, "Ok") == 0);
    lm_toolcall_out out;
    LM_CHECK(lm_toolcall_parser_finish(p, &out) == 1);
    LM_CHECK(out.content_len == 0 && out.n_calls == 0);
    lm_toolcall_parser_free(p);
}

LM_TEST(parse_toolcall_xml_streams_strings) {
    json_t *tools = json_loads(TOOLS, 0, NULL);
    lm_toolcall_opts opts = { .tools = tools };
    lm_toolcall_parser *p = lm_toolcall_parser_create(&opts, NULL);
    json_decref(tools);
    LM_REQUIRE(p);
    tsnap o;
    tfeed(p, "<tool_call>\n<function=write_file>\n<parameter=content>\nline one\nline", &o);
    LM_CHECK(o.n_calls == 1 && strcmp(o.name, "write_file") == 0);
    LM_CHECK(strcmp(o.args, "{\"content\": \"line one\\nline") == 0);
    tfeed(p, " two\n</param", &o); /* "\n</param" may be the framing newline and the tag */
    LM_CHECK(strcmp(o.args, " two") == 0);
    tfeed(p, "eter>\n<parameter=overwrite>\ntrue\n", &o); /* a boolean comes out when complete */
    LM_CHECK(strcmp(o.args, "\"") == 0);
    tfeed(p, "</parameter>\n</function>", &o);
    LM_CHECK(strcmp(o.args, ", \"overwrite\": true}") == 0);
    lm_toolcall_out out;
    LM_CHECK(lm_toolcall_parser_finish(p, &out) == 1);
    json_t *calls = lm_toolcall_parser_calls_json(p);
    const char *args = json_string_value(json_object_get(json_object_get(json_array_get(calls, 0), "function"), "arguments"));
    LM_CHECK(args && strcmp(args, "{\"content\": \"line one\\nline two\", \"overwrite\": true}") == 0);
    json_decref(calls);
    lm_toolcall_parser_free(p);
}

LM_TEST(parse_toolcall_atomic_and_ids) {
    const char *text = "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n"
                       "<tool_call>\n{\"name\": \"b\", \"arguments\": {\"y\": [1, 2]}}\n</tool_call>";
    lm_toolcall_opts opts = { .atomic = true, .id_seed = 7 };
    lm_toolcall_parser *p = lm_toolcall_parser_create(&opts, NULL);
    lm_toolcall_out out;
    /* atomic: nothing until the object closes, then the whole call at once */
    lm_toolcall_parser_feed(p, text, 40, &out);
    LM_CHECK(out.n_calls == 0);
    lm_toolcall_parser_feed(p, text + 40, strlen(text) - 40, &out);
    LM_REQUIRE(out.n_calls == 2);
    LM_CHECK(out.calls[0].id && strcmp(out.calls[0].name, "a") == 0 && strcmp(out.calls[0].args, "{\"x\": 1}") == 0);
    LM_CHECK(out.calls[1].index == 1 && strcmp(out.calls[1].args, "{\"y\": [1, 2]}") == 0);
    char id0[64], id1[64];
    snprintf(id0, sizeof id0, "%s", out.calls[0].id);
    snprintf(id1, sizeof id1, "%s", out.calls[1].id);
    LM_CHECK(strncmp(id0, "call_", 5) == 0 && strlen(id0) == 29 && strcmp(id0, id1) != 0);
    json_t *j = lm_toolcall_out_json(&out);
    json_t *e = json_array_get(j, 0);
    LM_CHECK(json_integer_value(json_object_get(e, "index")) == 0);
    LM_CHECK(lm_streq(json_string_value(json_object_get(e, "type")), "function"));
    LM_CHECK(lm_streq(json_string_value(json_object_get(e, "id")), id0));
    json_decref(j);
    LM_CHECK(lm_toolcall_parser_finish(p, &out) == 2);
    lm_toolcall_parser_free(p);

    /* the same seed gives the same ids; another seed other ids */
    p = lm_toolcall_parser_create(&opts, NULL);
    lm_toolcall_parser_feed(p, text, strlen(text), &out);
    LM_CHECK(out.n_calls == 2 && strcmp(out.calls[0].id, id0) == 0);
    lm_toolcall_parser_free(p);
    opts.id_seed = 8;
    p = lm_toolcall_parser_create(&opts, NULL);
    lm_toolcall_parser_feed(p, text, strlen(text), &out);
    LM_CHECK(out.n_calls == 2 && strcmp(out.calls[0].id, id0) != 0);
    lm_toolcall_parser_free(p);
}

LM_TEST(parse_toolcall_options) {
    lm_err err = { { 0 } };
    lm_toolcall_opts o = { .open_tag = " <x>" };
    LM_CHECK(lm_toolcall_parser_create(&o, &err) == NULL && strstr(err.msg, "tags"));
    json_t *obj = json_object();
    lm_toolcall_opts o2 = { .tools = obj };
    LM_CHECK(lm_toolcall_parser_create(&o2, &err) == NULL && strstr(err.msg, "array"));
    json_decref(obj);
    /* other tags, e.g. a model that wraps calls in <function_call> */
    lm_toolcall_opts o3 = { .open_tag = "<function_call>", .close_tag = "</function_call>" };
    lm_toolcall_parser *p = lm_toolcall_parser_create(&o3, &err);
    LM_REQUIRE(p);
    tsnap s;
    tfeed(p, "x <tool_call> <function_call>{\"name\": \"f\"}</function_call>", &s);
    LM_CHECK(strcmp(s.content, "x <tool_call>") == 0 && s.n_calls == 1 && strcmp(s.args, "{}") == 0);
    lm_toolcall_parser_free(p);
}

/* ---- the JSON validator -------------------------------------------------------------- */

LM_TEST(parse_json_scan) {
    static const char *const good[] = {
        "{}", "[]", "0", "-0.5e+3", "\"a\\u00e9\\n\"", " {\"a\": [1, true, false, null, {\"b\": \"\"}]} ",
        "1E9", "[[[]]]", "{\"k\":{\"k\":{}}}", "\"\xE6\x97\xA5\"",
    };
    static const char *const bad[] = {
        "", "{", "[1,]", "{\"a\" 1}", "01", "1.", "-", "1e", "tru", "nul", "\"\\x\"", "\"\\u12G4\"",
        "{\"a\":1,}", "[1 2]", "{1: 2}", "\"a\nb\"", "1 2", "+1", ".5", "[}", "{]",
    };
    for (size_t i = 0; i < LM_COUNT(good); i++)
        LM_CHECK_MSG(lm_json_valid(good[i], strlen(good[i])), "%s", good[i]);
    for (size_t i = 0; i < LM_COUNT(bad); i++)
        LM_CHECK_MSG(!lm_json_valid(bad[i], strlen(bad[i])), "%s", bad[i]);

    /* nesting deeper than the bound is refused, not overflowed */
    char deep[LM_JSON_MAX_DEPTH * 2 + 4];
    size_t n = 0;
    for (int i = 0; i < LM_JSON_MAX_DEPTH + 1; i++) deep[n++] = '[';
    LM_CHECK(!lm_json_valid(deep, n));

    /* events: where top-level members begin and end */
    const char *doc = "{\"a\": 12, \"b\": [1]}";
    lm_json_scan js;
    lm_json_scan_init(&js);
    int begins = 0, ends = 0, keys = 0;
    for (size_t i = 0; doc[i]; i++) {
        LM_REQUIRE(lm_json_scan_byte(&js, (unsigned char)doc[i]) == 0);
        if ((js.ev & LM_JS_BEGIN) && js.begin_depth == 1) begins++;
        if ((js.ev & LM_JS_END) && js.end_depth == 1) ends++;
        if ((js.ev & LM_JS_END_BEFORE) && js.endb_depth == 1) {
            ends++;
            LM_CHECK(doc[i] == ','); /* "12" ends at the comma */
        }
        if ((js.ev & LM_JS_KEY_END) && js.depth == 1) keys++;
    }
    LM_CHECK(begins == 2 && ends == 2 && keys == 2 && lm_json_scan_end(&js));
}

/* ---- robustness: generated inputs, long inputs ---------------------------------------- */

/* Random "token soup" of tag pieces, JSON and XML fragments, whitespace and
 * UTF-8: whatever the parsers make of it, every chunking must agree, nothing
 * may crash, and every delta must stay valid UTF-8. */
LM_TEST(parse_random_soup_is_chunking_independent) {
    static const char *const pieces[] = {
        "<tool_call>", "</tool_call>", "<tool_", "\n", " ", "\n\n", "{", "}", "\"name\": ", "\"f\"", ", ",
        "\"arguments\": ", "{\"x\": 1}", "[", "]", "tru", "null", "<function=", "get", ">", "<parameter=",
        "p", "</parameter>", "</function>", "</para", "<think>", "</think>", "</th", "é", "日本", "🙂", "a", "<",
        "\"", "\\", "12", ".5", "text ",
    };
    uint64_t seed = 0x1234567;
    char buf[600];
    for (int t = 0; t < 60; t++) {
        size_t n = 0;
        int count = 5 + (int)(seed % 40);
        for (int k = 0; k < count; k++) {
            seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
            const char *pc = pieces[seed % LM_COUNT(pieces)];
            size_t L = strlen(pc);
            if (n + L >= sizeof buf) break;
            memcpy(buf + n, pc, L);
            n += L;
        }
        buf[n] = 0;
        char name[32];
        snprintf(name, sizeof name, "soup %d", t);
        pp_case c = {
            .name = name, .text = buf, .think = t % 2 == 0, .think_open = t % 4 == 0,
            .tools = true, .tools_json = t % 3 ? TOOLS : NULL, .tags_in_content = true,
        };
        int fails = pp_check_consistent(&c, 6, 40);
        if (fails) {
            fprintf(stderr, "  soup %d: [%s]\n", t, buf);
            lm_t_->failed += fails;
            break;
        }
    }
}

/* Generated answers: an optional think block (closed, or opened by the
 * prompt), text full of near-tags, 0-3 calls in either form, each possibly
 * unclosed, then one random mutation (a deleted range, a truncation or an
 * inserted piece). About half the calls stay valid, the rest exercise the
 * failure paths; every chunking must agree. */
static uint64_t gen_next(uint64_t *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

static void gen_put(char *b, size_t *n, size_t cap, const char *s) {
    size_t L = strlen(s);
    if (*n + L < cap) memcpy(b + *n, s, L), *n += L;
}

static void gen_text(char *b, size_t *n, size_t cap, uint64_t *seed, int words) {
    static const char *const w[] = {
        "hello", " ", "\n", "a<b", "x > y", "\xC3\xA9", "\xE6\x97\xA5", "</", "<", "\"q\"", "{", "}", "<tool", "</think", "\\",
    };
    for (int i = 0; i < words; i++) gen_put(b, n, cap, w[gen_next(seed) % LM_COUNT(w)]);
}

LM_TEST(parse_generated_outputs_are_chunking_independent) {
    static const char tools[] = "[{\"type\": \"function\", \"function\": {\"name\": \"get\", \"parameters\": {\"type\": \"object\","
                                " \"properties\": {\"p\": {\"type\": \"string\"}, \"n\": {\"type\": \"integer\"}}}}}]";
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    char buf[1200];
    for (int t = 0; t < 100; t++) {
        size_t n = 0, cap = sizeof buf - 16;
        int think = (int)(gen_next(&seed) % 3);
        if (think == 1) gen_put(buf, &n, cap, "<think>\n");
        if (think) {
            gen_text(buf, &n, cap, &seed, (int)(gen_next(&seed) % 6));
            gen_put(buf, &n, cap, "\n</think>\n\n");
        }
        gen_text(buf, &n, cap, &seed, (int)(gen_next(&seed) % 5));
        int calls = (int)(gen_next(&seed) % 4);
        for (int c = 0; c < calls; c++) {
            gen_put(buf, &n, cap, gen_next(&seed) % 2 ? "\n\n<tool_call>\n" : "<tool_call>");
            if (gen_next(&seed) % 2) {
                gen_put(buf, &n, cap, "{\"name\": \"get\", \"arguments\": {\"p\": \"");
                gen_text(buf, &n, cap, &seed, (int)(gen_next(&seed) % 3));
                gen_put(buf, &n, cap, "\", \"n\": 3, \"o\": [1, 2.5, null]}}");
            } else {
                gen_put(buf, &n, cap, "<function=get>\n<parameter=p>\n");
                gen_text(buf, &n, cap, &seed, (int)(gen_next(&seed) % 4));
                gen_put(buf, &n, cap, "\n</parameter>\n<parameter=n>\n42\n</parameter>\n</function>");
            }
            if (gen_next(&seed) % 4) gen_put(buf, &n, cap, "\n</tool_call>");
        }
        uint64_t m = gen_next(&seed) % 4, r = gen_next(&seed);
        if (m == 1 && n > 2) { /* delete a range */
            size_t a = r % n, l = LM_MIN(1 + (r >> 20) % 6, n - a);
            memmove(buf + a, buf + a + l, n - a - l);
            n -= l;
        } else if (m == 2 && n > 2) { /* truncate */
            n = r % n;
        } else if (m == 3 && n > 2) { /* insert a piece */
            size_t a = r % n, mark = n;
            gen_text(buf, &n, cap, &seed, 1);
            char piece[16];
            size_t L = n - mark;
            memcpy(piece, buf + mark, L);
            memmove(buf + a + L, buf + a, mark - a);
            memcpy(buf + a, piece, L);
        }
        buf[n] = 0;
        char name[32];
        snprintf(name, sizeof name, "generated %d", t);
        pp_case c = {
            .name = name, .text = buf, .think = true, .think_open = think == 2,
            .think_implicit = t % 2 ? "<tool_call>" : NULL,
            .tools = true, .tools_json = tools, .tags_in_content = true,
        };
        int fails = pp_check_consistent(&c, 4, 24);
        if (fails) {
            fprintf(stderr, "  generated %d: [%s]\n", t, buf);
            lm_t_->failed += fails;
            break;
        }
    }
}

/* Long inputs fed in tiny chunks must stay linear: a 256 KiB string
 * parameter, a 256 KiB JSON argument and 64 Ki newlines of content. */
LM_TEST(parse_long_inputs_are_linear) {
    static const char pat[] = "ab<c> /\xC3\xA9\n"; /* 10 bytes, "é" two of them */
    size_t big = 10 * 26214;
    char *code = malloc(big + 1);
    for (size_t i = 0; i < big; i += 10) memcpy(code + i, pat, 10);
    code[big] = 0;

    json_t *tools = json_loads(TOOLS, 0, NULL);
    lm_toolcall_opts opts = { .tools = tools };
    double t0 = lm_now();

    lm_toolcall_parser *p = lm_toolcall_parser_create(&opts, NULL);
    lm_toolcall_out out;
    const char *head = "<tool_call>\n<function=write_file>\n<parameter=content>\n";
    lm_toolcall_parser_feed(p, head, strlen(head), &out);
    size_t streamed = 0;
    for (size_t i = 0; i < big; i += 3) {
        lm_toolcall_parser_feed(p, code + i, LM_MIN((size_t)3, big - i), &out);
        for (int k = 0; k < out.n_calls; k++) streamed += out.calls[k].args_len;
    }
    const char *tail = "\n</parameter>\n</function>\n</tool_call>";
    lm_toolcall_parser_feed(p, tail, strlen(tail), &out);
    LM_CHECK(lm_toolcall_parser_finish(p, &out) == 1);
    LM_CHECK(streamed > big); /* the value streamed while it was generated */
    json_t *calls = lm_toolcall_parser_calls_json(p);
    json_t *args = json_loads(json_string_value(json_object_get(json_object_get(json_array_get(calls, 0), "function"), "arguments")), 0, NULL);
    LM_CHECK(args && lm_streq(json_string_value(json_object_get(args, "content")), code));
    json_decref(args);
    json_decref(calls);
    lm_toolcall_parser_free(p);

    /* JSON arguments, byte by byte */
    p = lm_toolcall_parser_create(&opts, NULL);
    head = "<tool_call>\n{\"name\": \"run_python\", \"arguments\": {\"code\": \"";
    lm_toolcall_parser_feed(p, head, strlen(head), &out);
    for (size_t i = 0; i < big; i++) {
        char c = code[i] == '\n' || code[i] == '\\' ? ' ' : code[i];
        lm_toolcall_parser_feed(p, &c, 1, &out);
    }
    tail = "\"}}\n</tool_call>";
    lm_toolcall_parser_feed(p, tail, strlen(tail), &out);
    LM_CHECK(lm_toolcall_parser_finish(p, &out) == 1);
    lm_toolcall_parser_free(p);

    /* 64 Ki newlines of content (a degenerate model), one at a time */
    p = lm_toolcall_parser_create(&opts, NULL);
    size_t got = 0;
    for (int i = 0; i < 65536; i++) {
        lm_toolcall_parser_feed(p, "\n", 1, &out);
        got += out.content_len;
    }
    lm_toolcall_parser_feed(p, "x", 1, &out);
    got += out.content_len;
    lm_toolcall_parser_finish(p, &out);
    LM_CHECK(got == 65537);
    lm_toolcall_parser_free(p);

    /* reasoning and stop matcher over the same long text */
    lm_reasoning_parser *rp = lm_reasoning_parser_create(NULL, NULL);
    lm_reasoning_delta d;
    lm_reasoning_parser_feed(rp, "<think>", 7, &d);
    size_t rgot = 0;
    for (size_t i = 0; i < big; i += 2) {
        lm_reasoning_parser_feed(rp, code + i, LM_MIN((size_t)2, big - i), &d);
        rgot += d.reasoning_len;
    }
    lm_reasoning_parser_finish(rp, &d);
    rgot += d.reasoning_len;
    LM_CHECK(rgot == big - 1); /* the final newline is framing */
    lm_reasoning_parser_free(rp);
    const char *st[] = { "never appears in it", "</think>" };
    lm_stop_matcher *sm = lm_stop_matcher_create(st, NULL, 2);
    lm_stop_result sr;
    size_t sgot = 0;
    for (size_t i = 0; i < big; i++) {
        lm_stop_matcher_feed(sm, code + i, 1, &sr);
        sgot += sr.len;
    }
    lm_stop_matcher_finish(sm, &sr);
    LM_CHECK(sgot + sr.len == big);
    lm_stop_matcher_free(sm);

    double dt = lm_now() - t0;
    LM_CHECK_MSG(dt < 3.0, "long inputs took %.2f s", dt);
    json_decref(tools);
    free(code);
}
