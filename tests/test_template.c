/* test_template.c - the Jinja interpreter's language features, one small
 * template at a time, with outputs as Python jinja2 (configured like
 * transformers) renders them; and its error messages (line:column). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lm_test.h"
#include "template/lm_template.h"

/* Renders src with the JSON context ctx (NULL = {}); returns the text
 * (malloc'd) or NULL with the error in *err. */
static char *render(const char *src, const char *ctx, lm_err *err) {
    json_error_t je;
    json_t *c = json_loads(ctx ? ctx : "{}", 0, &je);
    if (!c) {
        snprintf(err->msg, sizeof err->msg, "bad test JSON: %s", je.text);
        return NULL;
    }
    lm_template *t;
    char *out = NULL;
    size_t n;
    lm_template_opts o = { .now = 1704164645 }; /* 2024-01-02 03:04:05 UTC */
    if (lm_template_parse(src, strlen(src), "t", &t, err) == 0) {
        if (lm_template_render(t, c, &o, &out, &n, err)) out = NULL;
        lm_template_free(t);
    }
    json_decref(c);
    return out;
}

#define EXPECT(src, ctx, want)                                                                   \
    do {                                                                                         \
        lm_err e_ = { { 0 } };                                                                   \
        char *got_ = render(src, ctx, &e_);                                                      \
        LM_CHECK_MSG(got_ && !strcmp(got_, want), "%s\n    want [%s]\n    got  [%s]", src, want, \
                     got_ ? got_ : e_.msg);                                                      \
        free(got_);                                                                              \
    } while (0)

/* The render (or parse) must fail with a message containing want. */
#define EXPECT_ERR(src, ctx, want)                                                                \
    do {                                                                                          \
        lm_err e_ = { { 0 } };                                                                    \
        char *got_ = render(src, ctx, &e_);                                                       \
        LM_CHECK_MSG(!got_ && strstr(e_.msg, want), "%s\n    want error [%s]\n    got [%s]", src, \
                     want, got_ ? got_ : e_.msg);                                                 \
        free(got_);                                                                               \
    } while (0)

LM_TEST(template_literals_and_printing) {
    EXPECT("{{ 1 }}|{{ 2.5 }}|{{ 'a' }}|{{ \"b\" }}|{{ true }}|{{ none }}|{{ [1, 'x'] }}", NULL,
           "1|2.5|a|b|True|None|[1, 'x']");
    EXPECT("{{ {'a': 1, 'b': [none, false]} }}|{{ (1,) }}|{{ () }}|{{ (1, 'a') }}", NULL,
           "{'a': 1, 'b': [None, False]}|(1,)|()|(1, 'a')");
    EXPECT("{{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 1e-5 }} {{ 0.1 + 0.2 }} {{ 3.0 }} {{ -0.0 }}", NULL,
           "1e+16 1000000000000000.0 0.0001 1e-05 0.30000000000000004 3.0 -0.0");
    EXPECT("{{ 1_000 }} {{ 0x1F }} {{ 0o17 }} {{ 0b11 }} {{ 'a' 'b' }}", NULL, "1000 31 15 3 ab");
    EXPECT("{{ 'it\\'s' }} {{ \"q\\\"\" }} {{ '\\x41\\u00e9\\n' }} {{ ['it\\'s', 'a\\nb'] }}", NULL,
           "it's q\" A\xc3\xa9\n [\"it's\", 'a\\nb']");
    EXPECT("{{ undefined_thing }}[{{ missing.attr is defined }}]", "{\"missing\": {}}", "[False]");
}

LM_TEST(template_operators) {
    EXPECT("{{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 7.5 // 2 }}", NULL,
           "3.5 3 -4 2 1024 0.5 3.0");
    EXPECT("{{ 'a' ~ 1 ~ none ~ true }} {{ 'ab' * 2 }} {{ [1] + [2] }} {{ 'x' + 'y' }}", NULL, "a1NoneTrue abab [1, 2] xy");
    EXPECT("{{ 1 == 1.0 }} {{ true == 1 }} {{ 1 < 2 < 3 }} {{ 'a' in 'cat' }} {{ 2 not in [1] }} {{ 'k' in {'k': 0} }}",
           NULL, "True True True True True True");
    EXPECT("{{ 0 or '' or 'x' }} {{ 1 and 2 }} {{ not 0 }} {{ 'y' if 0 else 'n' }} [{{ 'y' if 0 }}]", NULL,
           "x 2 True n []");
    EXPECT("{{ -3|abs }} {{ -(1 + 2) }} {{ messages|length - 1 }}", "{\"messages\": [1, 2, 3]}", "3 -3 2");
    EXPECT_ERR("{{ 1 + 'a' }}", NULL, "unsupported operand type(s) for +: 'int' and 'str'");
    EXPECT_ERR("{{ 'a' + 1 }}", NULL, "can only concatenate str (not \"int\") to str");
    EXPECT_ERR("{{ 1 // 0 }}", NULL, "integer division or modulo by zero");
    EXPECT_ERR("{{ none + 'a' }}", NULL, "unsupported operand type(s) for +: 'NoneType' and 'str'");
}

LM_TEST(template_access_and_slicing) {
    const char *ctx = "{\"m\": {\"role\": \"user\", \"items\": 5}, \"l\": [1, 2, 3, 4], \"s\": \"h\\u00e9llo\"}";
    EXPECT("{{ m.role }} {{ m['role'] }} {{ l[0] }} {{ l[-1] }} {{ l.1 }} {{ s[1] }} {{ s[-1] }}", ctx, "user user 1 4 2 \xc3\xa9 o");
    EXPECT("{{ l[1:3] }} {{ l[::-1] }} {{ l[:-1] }} {{ s[1:3] }} {{ s[::-1] }} {{ l[10:] }}", ctx,
           "[2, 3] [4, 3, 2, 1] [1, 2, 3] \xc3\xa9l oll\xc3\xa9h []");
    /* attribute access prefers methods, item access prefers keys */
    EXPECT("{{ m['items'] }} {{ m.items()|list }}", ctx, "5 [('role', 'user'), ('items', 5)]");
    EXPECT("[{{ m.nope }}][{{ l[9] }}][{{ m.nope is defined }}]", ctx, "[][][False]");
    EXPECT_ERR("{{ m.nope.deeper }}", ctx, "'dict object' has no attribute 'nope'");
    EXPECT_ERR("{{ nothing.x }}", ctx, "'nothing' is undefined");
    EXPECT_ERR("{{ m.nope + 1 }}", ctx, "'dict object' has no attribute 'nope'");
}

LM_TEST(template_whitespace_control) {
    /* trim_blocks and lstrip_blocks as transformers sets them */
    EXPECT("a\n  {% if true %}\n  b\n  {% endif %}\nc", NULL, "a\n  b\nc");
    EXPECT("a  {%- if true -%}  b  {%- endif -%}  c", NULL, "abc");
    EXPECT("a\n{{- 'b' -}}\nc", NULL, "abc");
    EXPECT("x {{ 'v' }}\ny", NULL, "x v\ny");                 /* no trimming after }} */
    EXPECT("a\n  {%+ if true %}b{% endif %}", NULL, "a\n  b");  /* {%+ keeps the indent */
    EXPECT("{% if true +%}\nb{% endif %}", NULL, "\nb");         /* +%} keeps the newline */
    EXPECT("a\n  {# note #}\nb", NULL, "a\nb");
    EXPECT("a {# note #} b", NULL, "a  b");
    EXPECT("{% raw %}{{ x }}{% endraw %}", NULL, "{{ x }}");
    EXPECT("line\n", NULL, "line");         /* one trailing newline is dropped */
    EXPECT("a\r\nb", NULL, "a\nb");         /* newlines are normalised */
    EXPECT("{{ {'a': {'b': 1}} }}", NULL, "{'a': {'b': 1}}"); /* }} inside braces */
}

/* ---- tables: expected outputs were produced by Python jinja2 3.1 in
 * transformers' configuration (ImmutableSandboxedEnvironment, trim_blocks,
 * lstrip_blocks, loopcontrols, json.dumps tojson) with this context: */
static const char k_ctx[] =
    "{\"l\": [\"a\", \"b\", \"c\"], \"d\": {\"x\": 1, \"y\": 2}, \"n\": [3, 1, 2], \"msgs\": ["
    "{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"U\"}, "
    "{\"role\": \"assistant\", \"content\": null}, {\"role\": \"tool\", \"content\": \"T\"}]}";

typedef struct tpl_case {
    const char *src, *want;
} tpl_case;

static const tpl_case k_loops[] = {
    { "{% for x in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ x }};{% endfor %}",
      "1032TrueFalse3a;2121FalseFalse3b;3210FalseTrue3c;" },

    { "{% for x in l %}[{{ loop.previtem }}|{{ loop.nextitem }}|{{ loop.cycle('o', 'e') }}]{% endfor %}",
      "[|b|o][a|c|e][b||o]" },

    { "{% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %}{% for k in d %}{{ k }}{% endfor %}{% for c in 'h\xc3""\xa9""' %}<{{ c }}>{% endfor %}",
      "x=1,y=2,xy<h><\xc3""\xa9"">" },

    { "{% for x in [] %}x{% else %}empty{% endfor %}|{% for x in n if x > 1 %}{{ x }}/{{ loop.length }} {% endfor %}",
      "empty|3/2 2/2 " },

    { "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}|{{ range(3)|list }}{{ range(1, 8, 3)|list }}{{ range(4, 0, -2)|list }}",
      "0134|[0, 1, 2][1, 4, 7][4, 2]" },

    { "{% set x = 'outer' %}{% for i in [1] %}{% set x = 'inner' %}{{ x }}{% endfor %}{{ x }}",
      "innerouter" },

    { "{% set ns = namespace(total=0, seen=[]) %}{% for i in n %}{% set ns.total = ns.total + i %}{% set ns.seen = ns.seen + [i] %}{% endfor %}{{ ns.total }} {{ ns.seen }}",
      "6 [3, 1, 2]" },

    { "{% for m in msgs %}{% if m.role == 'system' %}{% continue %}{% endif %}{{ m.role }}{% if not loop.last %},{% endif %}{% endfor %}",
      "user,assistant,tool" },

    { "{% for x in [1, [2, [3]]] recursive %}{% if x is iterable %}({{ loop(x) }}){% else %}{{ x }}@{{ loop.depth }}{% endif %}{% endfor %}",
      "1@1(2@2(3@3))" },

    { "{% for a, b in [(1, 2), (3, 4)] %}{{ a + b }}{% endfor %}{% for x in l %}{% if loop.changed(x) %}{{ x }}{% endif %}{% endfor %}",
      "37abc" },

    { "{% for x in [1, 2] %}{{ x }}{% break %}{% else %}E{% endfor %}|{% for x in [1, 2] %}{% if loop.last %}{% continue %}{% endif %}{{ x }}{% else %}E{% endfor %}|{% for x in [1, 2] %}{% if loop.first %}{% continue %}{% endif %}{{ x }}{% else %}E{% endfor %}",
      "1E|1|2" },

};

static const tpl_case k_filters[] = {
    { "{{ [3, 1]|sort(attribute='0') }}|{{ msgs|sort(attribute='nope')|map(attribute='role')|join }}|{{ x is callable }}|{{ [1, 2]|truncate(10) }}|{{ x|truncate(3) }}",
      "[3, 1]|systemuserassistanttool|True|[1, 2]|" },

    { "{{ n|sort }}|{{ n|sort(reverse=true) }}|{{ ['b', 'A', 'c']|sort }}|{{ ['b', 'A', 'c']|sort(case_sensitive=true) }}|{{ msgs|sort(attribute='role')|map(attribute='role')|join(',') }}",
      "[1, 2, 3]|[3, 2, 1]|['A', 'b', 'c']|['A', 'b', 'c']|assistant,system,tool,user" },

    { "{{ n|max }}{{ n|min }}{{ n|sum }}{{ n|first }}{{ n|last }}{{ n|length }}{{ n|count }}|{{ n|reverse|list }}|{{ 'abc'|reverse }}|{{ n|list }}|{{ 'ab'|list }}",
      "3163233|[2, 1, 3]|cba|[3, 1, 2]|['a', 'b']" },

    { "{{ d|dictsort }}|{{ d|dictsort(by='value', reverse=true) }}|{{ d|items|list }}|{{ undefined_x|items|list }}",
      "[('x', 1), ('y', 2)]|[('y', 2), ('x', 1)]|[('x', 1), ('y', 2)]|[]" },

    { "{{ msgs|map(attribute='role')|join(', ') }}|{{ msgs|selectattr('role', 'equalto', 'user')|list|length }}|{{ msgs|rejectattr('content')|map(attribute='role')|list }}|{{ msgs|selectattr('content', 'none')|list|length }}",
      "system, user, assistant, tool|1|['assistant']|1" },

    { "{{ [1, 2, 3, 4]|select('odd')|list }}|{{ [1, 2, 3, 4]|reject('even')|list }}|{{ ['a', 'b']|map('upper')|list }}|{{ [0, 1, '', 'x']|select|list }}|{{ [1, 1, 2, 'a', 'A']|unique|list }}|{{ msgs|map(attribute='nope', default='-')|join }}",
      "[1, 3]|[1, 3]|['A', 'B']|[1, 'x']|[1, 2, 'a']|----" },

    { "{{ 3.7|int }}|{{ '12'|int }}|{{ 'x'|int(5) }}|{{ '0x1f'|int(0, 16) }}|{{ '3.5'|float }}|{{ 'x'|float }}|{{ 2.567|round(2) }}|{{ 2.5|round }}|{{ 3.5|round }}|{{ 2.1|round(0, 'ceil') }}|{{ 7|round }}",
      "3|12|5|31|3.5|0.0|2.57|2.0|4.0|3.0|7" },

    { "{{ '  a b  '|trim }}|{{ 'xxa'|trim('x') }}|{{ 'Hello World'|lower }}{{ 'Hello'|upper }}|{{ 'hello-world (x)'|title }}|{{ 'hELLO'|capitalize }}|{{ 'a b  c'|wordcount }}|{{ 'hello'|replace('l', 'L') }}|{{ 'x'|center(5) }}",
      "a b|a|hello worldHELLO|Hello-World (X)|Hello|3|heLLo|  x  " },

    { "{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(2, blank=true) }}|{{ 'x'|indent('> ', first=true) }}",
      "a\n  b\n\n  c|  a\n  b|a\n  \n  b|> x" },

    { "{{ undefined_x|default('d') }}|{{ ''|default('e', true) }}|{{ none|default('n') }}|{{ none|d('n', true) }}|{{ 0|string }}{{ none|string }}{{ true|string }}|{{ [1, none]|join('|') }}|{{ n|join }}",
      "d|e|None|n|0NoneTrue|1|None|312" },

    { "{{ '<a href=\"x\">&\\'</a>'|e }}|{{ '<b>'|safe }}|{{ ('<' ~ ('<b>'|safe)) }}|{{ '%s=%s'|format('a', 1) }}|{{ 'Hello world foo bar'|truncate(13) }}|{{ [1, 2, 3]|batch(2)|list }}",
      "&lt;a href=&#34;x&#34;&gt;&amp;&#39;&lt;/a&gt;|<b>|<<b>|a=1|Hello...|[[1, 2], [3]]" },

    { "{{ msgs|groupby('role')|map(attribute='grouper')|list }}|{% for k, items in msgs|groupby('role') %}{{ k }}{{ items|length }}{% endfor %}|{{ n|map('string')|join('+') }}|{{ d|attr('keys') is callable }}",
      "['assistant', 'system', 'tool', 'user']|assistant1system1tool1user1|3+1+2|True" },

    { "{{ 'The quick brown fox jumps over the lazy dog'|wordwrap(10) }}|{{ '  well-known hyphen-ated words'|wordwrap(8, wrapstring='/') }}|{{ 'supercalifragilistic'|wordwrap(6) }}|{{ 'a\\n\\nb c'|wordwrap(3) }}",
      "The quick\nbrown fox\njumps over\nthe lazy\ndog|  well-/known/hyphen-/ated/words|superc\nalifra\ngilist\nic|a\n\nb c" },

};

static const tpl_case k_statements[] = {
    { "{% if 0 %}a{% elif '' %}b{% elif [1] %}c{% else %}d{% endif %}",
      "c" },

    { "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = (3,) %}{{ t }}{% set cap %}  x{{ a }}  {% endset %}[{{ cap }}]{% set up | upper | trim %} hi {% endset %}[{{ up }}]",
      "12(3,)[  x1  ][HI]" },

    { "{% macro m(a, b=2, c='x') %}[{{ a }}{{ b }}{{ c }}{{ varargs }}{{ kwargs }}]{% endmacro %}{{ m(1) }}{{ m(1, 3) }}{{ m(1, c='z') }}{{ m(1, 2, 3, 4) }}{{ m(1, q=5) }}",
      "[12x(){}][13x(){}][12z(){}][123(4,){}][12x(){'q': 5}]" },

    { "{% macro rec(n) %}{% if n > 0 %}{{ n }}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(4) }}{% macro later() %}{{ helper() }}{% endmacro %}{% macro helper() %}H{% endmacro %}{{ later() }}",
      "4321H" },

    { "{% macro box() %}<{{ caller() }}>{% endmacro %}{% call box() %}inside{% endcall %}{% macro each(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro %}{% call(v) each([1, 2]) %}[{{ v }}]{% endcall %}",
      "<inside>[1][2]" },

    { "{% filter upper %}up {{ 'x' }}{% endfilter %}{% with q = 5, r = 6 %}{{ q * r }}{% endwith %}[{{ q }}]",
      "UP X30[]" },

    { "{%- generation -%}gen {{ 1 }}{%- endgeneration -%}|{% set messages = msgs[1:] %}{{ messages|length }}",
      "gen 1|3" },

};

static const tpl_case k_strings[] = {
    { "{{ ' a b '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ ' a '.lstrip() }}|{{ ' a '.rstrip() }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'a b c'.rsplit(' ', 1) }}",
      "a b|a|a | a|['a', 'b', '', 'c']|['a', 'b']|['a', 'b c']|['a b', 'c']" },

    { "{{ 'Hello'.startswith('He') }}{{ 'Hello'.endswith(('x', 'lo')) }}|{{ 'hello world'.title() }}|{{ 'hELLO'.capitalize() }}|{{ 'Ab'.swapcase() }}|{{ 'h\xc3""\xa9""llo \xc3""\x9f""'.upper() }}|{{ '\xc3""\x89""COLE'.lower() }}",
      "TrueTrue|Hello World|Hello|aB|H\xc3""\x89""LLO SS|\xc3""\xa9""cole" },

    { "{{ 'hello'.replace('l', 'L') }}|{{ 'hello'.replace('l', 'L', 1) }}|{{ 'ab'.replace('', '-') }}|{{ 'hello'.find('l') }}{{ 'hello'.rfind('l') }}{{ 'hello'.find('z') }}|{{ 'hello'.count('l') }}",
      "heLLo|heLlo|-a-b-|23-1|2" },

    { "{{ '{} and {}'.format(1, 'b') }}|{{ '{0}{1}{0}'.format('a', 'b') }}|{{ '{x:>5}|{y:.2f}'.format(x='r', y=3.14159) }}|{{ '{:^7}'.format('mid') }}|{{ '{!r}'.format('q') }}",
      "1 and b|aba|    r|3.14|  mid  |'q'" },

    { "{{ '%s-%d-%05.2f-%x-%r' % ('a', 3, 2.5, 255, 'q') }}|{{ '%(a)s!' % {'a': 1} }}|{{ '%5s|%-5s|' % ('ab', 'cd') }}|{{ '%.3s' % 'abcdef' }}|{{ '%%' % () }}",
      "a-3-02.50-ff-'q'|1!|   ab|cd   ||abc|%" },

    { "{{ 'x'.center(7, '*') }}|{{ 'ab'.ljust(4) }}|{{ 'ab'.rjust(4, '.') }}|{{ '42'.zfill(5) }}|{{ ', '.join(['a', 'b']) }}|{{ 'a-b'.partition('-') }}|{{ 'pre_x'.removeprefix('pre_') }}|{{ 'a\\nb\\r\\nc'.splitlines() }}",
      "***x***|ab  |..ab|00042|a, b|('a', '-', 'b')|x|['a', 'b', 'c']" },

    { "{{ '123'.isdigit() }}{{ 'ab'.isalpha() }}{{ 'a1'.isalnum() }}{{ ' '.isspace() }}{{ 'AB'.isupper() }}{{ 'ab'.islower() }}",
      "TrueTrueTrueTrueTrueTrue" },

};

static const tpl_case k_tojson[] = {
    { "{{ d|tojson }}|{{ msgs[2]|tojson }}|{{ {'b': 1, 'a': [1.5, true, none]}|tojson }}|{{ '\xc3""\xa9""\\n\"\\\\'|tojson }}|{{ '\xc3""\xa9""\xf0""\x9f""\x98""\x80""'|tojson(ensure_ascii=true) }}",
      "{\"x\": 1, \"y\": 2}|{\"role\": \"assistant\", \"content\": null}|{\"b\": 1, \"a\": [1.5, true, null]}|\"\xc3""\xa9""\\n\\\"\\\\\"|\"\\u00e9\\ud83d\\ude00\"" },

    { "{{ d|tojson(indent=2) }}|{{ [1, {}, []]|tojson(indent=1) }}|{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}|{{ [1, 2]|tojson(separators=(',', ':')) }}|{{ {'k': 'v'}|tojson(indent='\\t') }}",
      "{\n  \"x\": 1,\n  \"y\": 2\n}|[\n 1,\n {},\n []\n]|{\"a\": 2, \"b\": 1}|[1,2]|{\n\t\"k\": \"v\"\n}" },

    { "{{ [0.1, 1e-07, 1e16, 100.0, -0.0, 3]|tojson }}|{{ {1: 'a', true: 'b', none: 'c'}|tojson }}|{{ '\\x01\\x7f'|tojson }}",
      "[0.1, 1e-07, 1e+16, 100.0, -0.0, 3]|{\"1\": \"b\", \"null\": \"c\"}|\"\\u0001\x7f""\"" },

};

static const tpl_case k_tests[] = {
    { "{{ x is defined }}{{ l is defined }}{{ none is none }}{{ 1 is number }}{{ true is number }}{{ true is integer }}{{ 1.0 is float }}{{ true is boolean }}{{ 1 is boolean }}",
      "FalseTrueTrueTrueTrueFalseTrueTrueFalse" },

    { "{{ d is mapping }}{{ d is sequence }}{{ l is iterable }}{{ 'a' is string }}{{ 'a' is iterable }}{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 'a' is in 'abc' }}{{ 5 is gt 3 }}{{ 5 is eq 5 }}{{ 5 is ne 5 }}",
      "TrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueFalse" },

    { "{{ 'ABC' is upper }}{{ 'abc' is lower }}{{ true is true }}{{ 1 is true }}{{ false is false }}{{ range is callable }}{{ x is undefined }}{{ none is sameas none }}{{ 1 is not string }}{{ (l|select) is sequence }}",
      "TrueTrueTrueFalseTrueTrueTrueTrueTrueFalse" },

};

static const tpl_case k_globals[] = {
    { "{{ namespace(a=1).a }}{{ dict(k=2)['k'] }}{{ dict({'z': 3}, y=4)|tojson }}{% set j = joiner('|') %}{% for x in l %}{{ j() }}{{ x }}{% endfor %}",
      "12{\"z\": 3, \"y\": 4}a|b|c" },

    { "{{ strftime_now('%Y-%m-%d %H:%M') }}|{{ strftime_now('%d %b %Y') }}",
      "2024-01-02 03:04|02 Jan 2024" },

};

static const tpl_case k_values[] = {
    { "{{ d.keys() }}|{{ d.values() }}|{{ d.items() }}|{{ d.get('x') }}{{ d.get('z') }}{{ d.get('z', 0) }}|{{ l.index('b') }}{{ l.count('a') }}|{{ [1, [2, (3,)], {'a': none}] }}|{{ ['a\"b', \"c'd\", 'e\\tf', '\\x00'] }}",
      "dict_keys(['x', 'y'])|dict_values([1, 2])|dict_items([('x', 1), ('y', 2)])|1None0|11|[1, [2, (3,)], {'a': None}]|['a\"b', \"c'd\", 'e\\tf', '\\x00']" },

    { "{{ 10 / 4 }} {{ 10 / 5 }} {{ 1e300 * 1e300 }} {{ 2 ** 62 }} {{ 1 / 3 }} {{ 123456789.123456789 }} {{ 1e-300 }} {{ 5e-324 }} {{ 1.7976931348623157e308 }}",
      "2.5 2.0 inf 4611686018427387904 0.3333333333333333 123456789.12345679 1e-300 5e-324 1.7976931348623157e+308" },

};

static void run_table(lm_test_ctx *lm_t_, const tpl_case *cases, size_t n) {
    for (size_t i = 0; i < n; i++) EXPECT(cases[i].src, k_ctx, cases[i].want);
}

LM_TEST(template_loops) { run_table(lm_t_, k_loops, LM_COUNT(k_loops)); }
LM_TEST(template_statements) { run_table(lm_t_, k_statements, LM_COUNT(k_statements)); }
LM_TEST(template_string_methods) { run_table(lm_t_, k_strings, LM_COUNT(k_strings)); }
LM_TEST(template_filters) { run_table(lm_t_, k_filters, LM_COUNT(k_filters)); }
LM_TEST(template_tojson) { run_table(lm_t_, k_tojson, LM_COUNT(k_tojson)); }
LM_TEST(template_tests) { run_table(lm_t_, k_tests, LM_COUNT(k_tests)); }
LM_TEST(template_values) { run_table(lm_t_, k_values, LM_COUNT(k_values)); }

LM_TEST(template_globals) {
    /* strftime_now formats local time; pin the zone so the fixed instant
     * (opts.now) reads as 2024-01-02 03:04:05 */
    setenv("TZ", "UTC", 1);
    tzset();
    run_table(lm_t_, k_globals, LM_COUNT(k_globals));
}

/* Keys keep the order of the JSON context (Python dicts do; tojson shows it). */
LM_TEST(template_context_key_order) {
    EXPECT("{{ d|tojson }} {% for k in d %}{{ k }}{% endfor %}", "{\"d\": {\"z\": 1, \"a\": 2, \"m\": 3}}",
           "{\"z\": 1, \"a\": 2, \"m\": 3} zam");
}

/* ---- errors -------------------------------------------------------------- */

LM_TEST(template_parse_errors_have_line_and_column) {
    EXPECT_ERR("{% if x %}\nabc", NULL, "t:2:4: unexpected end of template: 'if' (line 1) needs 'endif'");
    EXPECT_ERR("ab\n  {{ 1 + }}", NULL, "t:2:10: expected an expression, got end of print statement '}}'");
    EXPECT_ERR("{% for x in y %}{% endif %}", NULL, "t:1:20: unexpected 'endif': 'for' needs 'endfor' first");
    EXPECT_ERR("{{ x | nosuchfilter }}", NULL, "t:1:8: no filter named 'nosuchfilter'");
    EXPECT_ERR("{{ x is nosuchtest }}", NULL, "t:1:6: no test named 'nosuchtest'");
    EXPECT_ERR("{% frobnicate %}", NULL, "t:1:4: unknown tag 'frobnicate'");
    EXPECT_ERR("{{ 'abc }}", NULL, "t:1:4: unterminated string");
    EXPECT_ERR("x\n{# never closed", NULL, "t:2:1: missing end of comment tag");
    EXPECT_ERR("{{ a b }}", NULL, "t:1:6: expected end of print statement '}}', got 'b'");
    EXPECT_ERR("{% break %}", NULL, "t:1:4: 'break' outside of a loop");
    EXPECT_ERR("{% include 'x' %}", NULL, "'include' is not supported");
    EXPECT_ERR("{{ x }", NULL, "t:1:6: unexpected '}'");
    EXPECT_ERR("{{ x ", NULL, "t:1:1: unexpected end of template: '{{' tag never closed");
    EXPECT_ERR("{{ ) }}", NULL, "t:1:4: unexpected ')'");
    EXPECT_ERR("{{ x $ y }}", NULL, "t:1:6: unexpected char '$'");
    EXPECT_ERR("\xff", NULL, "t:1:1: template is not valid UTF-8");
    EXPECT_ERR("{% macro m(a=1, b) %}{% endmacro %}", NULL, "non-default argument follows default argument");
    EXPECT_ERR("{{ x[:, :-1] }}", NULL, "t:1:6: slices inside a tuple subscript are not supported"); /* fuzz finding */
}

LM_TEST(template_render_errors_have_line_and_column) {
    EXPECT_ERR("line one\n{{ raise_exception('Roles must alternate') }}", NULL, "t:2:4: Roles must alternate");
    EXPECT_ERR("{{ messages[0].content.strip() }}", "{\"messages\": [{\"content\": null}]}",
               "t:1:23: 'None' has no attribute 'strip'");
    EXPECT_ERR("{% for m in messages %}\n  {{ m.content.strip() }}{% endfor %}", "{\"messages\": [{\"role\": \"user\"}]}",
               "t:2:15: 'dict object' has no attribute 'content'");
    EXPECT_ERR("{{ messages[0].content + '!' }}", "{\"messages\": [{\"content\": null}]}",
               "t:1:24: unsupported operand type(s) for +: 'NoneType' and 'str'");
    EXPECT_ERR("{{ x|tojson }}", NULL, "t:1:6: Object of type Undefined is not JSON serializable");
    EXPECT_ERR("{% for x in 5 %}{% endfor %}", NULL, "'int' object is not iterable");
    EXPECT_ERR("{{ 'a' in none }}", NULL, "argument of type 'NoneType' is not iterable");
    EXPECT_ERR("{% set a, b = [1] %}", NULL, "not enough values to unpack (expected 2, got 1)");
    EXPECT_ERR("{% set x.y = 1 %}", "{\"x\": {}}", "can only assign attributes of a namespace(), not dict");
    EXPECT_ERR("{{ 'a'.nope() }}", NULL, "'str object' has no attribute 'nope'");
}

/* Hostile templates end with an error, not a hang or a crash. */
LM_TEST(template_limits) {
    EXPECT_ERR("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", NULL, "maximum recursion depth exceeded");
    EXPECT_ERR("{{ range(100000000)|list }}", NULL, "range too large");
    EXPECT_ERR("{{ 'x' * 1000000000000 }}", NULL, "string repetition too large");
    EXPECT_ERR("{{ 9223372036854775807 + 1 }}", NULL, "integer overflow");
    lm_template *t;
    lm_err e;
    const char *src = "{% for i in range(1000000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}";
    LM_REQUIRE(lm_template_parse(src, strlen(src), "t", &t, &e) == 0);
    lm_template_opts o = { .max_steps = 100000 };
    char *out;
    size_t n;
    LM_CHECK(lm_template_render(t, NULL, &o, &out, &n, &e) == -1);
    LM_CHECK(strstr(e.msg, "too many steps") != NULL);
    lm_template_free(t);
    /* recursion through a macro whose body nests expressions deeply */
    char rec[2048];
    size_t r = (size_t)snprintf(rec, sizeof rec, "{%% macro f(n) %%}{{ ");
    for (int i = 0; i < 90; i++) rec[r++] = '[';
    r += (size_t)snprintf(rec + r, sizeof rec - r, "f(n + 1)");
    for (int i = 0; i < 90; i++) rec[r++] = ']';
    snprintf(rec + r, sizeof rec - r, " }}{%% endmacro %%}{{ f(0) }}");
    EXPECT_ERR(rec, NULL, "maximum recursion depth exceeded");
    /* deep nesting is refused by the parser, not the stack */
    char deep[4096];
    size_t k = 0;
    k += (size_t)snprintf(deep + k, sizeof deep - k, "{{ ");
    for (int i = 0; i < 1000; i++) deep[k++] = '(';
    deep[k++] = '1';
    for (int i = 0; i < 1000; i++) deep[k++] = ')';
    snprintf(deep + k, sizeof deep - k, " }}");
    EXPECT_ERR(deep, NULL, "nested too deeply");
}

/* The template sources a model can carry. */
LM_TEST(template_load_source) {
    const char *dir = lm_test_tmpdir();
    char path[512], *src;
    size_t len;
    lm_err e;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    FILE *f = fopen(path, "w");
    LM_REQUIRE(f);
    fputs("{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"}, {\"name\": \"default\", \"template\": \"{{ 1 }}\"}]}", f);
    fclose(f);
    LM_REQUIRE(lm_template_load_source(path, &src, &len, &e) == 0);
    LM_CHECK(len == 7 && !strcmp(src, "{{ 1 }}"));
    free(src);
    LM_REQUIRE(lm_template_load_source(dir, &src, &len, &e) == 0); /* folder: falls back to tokenizer_config.json */
    LM_CHECK(!strcmp(src, "{{ 1 }}"));
    free(src);
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    f = fopen(path, "w");
    LM_REQUIRE(f);
    fputs("jinja file", f);
    fclose(f);
    LM_REQUIRE(lm_template_load_source(dir, &src, &len, &e) == 0); /* chat_template.jinja wins */
    LM_CHECK(!strcmp(src, "jinja file"));
    free(src);
    snprintf(path, sizeof path, "%s/none.json", dir);
    f = fopen(path, "w");
    LM_REQUIRE(f);
    fputs("{\"bos_token\": \"<s>\"}", f);
    fclose(f);
    LM_CHECK(lm_template_load_source(path, &src, &len, &e) == -1 && strstr(e.msg, "no chat_template"));
    /* a GGUF file whose metadata carries tokenizer.chat_template */
    static const char key[] = "tokenizer.chat_template", val[] = "{{ bos_token }}{% for m in messages %}{% endfor %}";
    uint8_t g[256];
    size_t o = 0;
    uint64_t u64;
    uint32_t u32;
#define PUT(x, n) (memcpy(g + o, (x), (n)), o += (n))
    PUT("GGUF", 4);
    u32 = 3, PUT(&u32, 4);                      /* version */
    u64 = 0, PUT(&u64, 8);                      /* tensors */
    u64 = 1, PUT(&u64, 8);                      /* metadata entries */
    u64 = sizeof key - 1, PUT(&u64, 8), PUT(key, sizeof key - 1);
    u32 = 8, PUT(&u32, 4);                      /* STRING */
    u64 = sizeof val - 1, PUT(&u64, 8), PUT(val, sizeof val - 1);
#undef PUT
    snprintf(path, sizeof path, "%s/model.gguf", dir);
    f = fopen(path, "wb");
    LM_REQUIRE(f);
    fwrite(g, 1, o, f);
    fclose(f);
    int rc = lm_template_load_source(path, &src, &len, &e);
    LM_CHECK_MSG(rc == 0, "%s", e.msg);
    if (rc == 0) {
        LM_CHECK(len == sizeof val - 1 && !memcmp(src, val, len));
        free(src);
    }
}
