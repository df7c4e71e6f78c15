/* test_cli_chat.c - `lumen chat` end to end: through a pipe (scripts) and
 * through a pseudo-terminal (a person: line editing, history, Ctrl-C), on
 * the bundled demo model. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "base/lm_base.h"
#include "guard_util.h"
#include "test_util.h"

/* ---- stats lines ------------------------------------------------------------------------ */

typedef struct turn_stats {
    int prompt, reused, fresh, generated;
} turn_stats;

/* The k-th "[N prompt tokens: R reused, F new; G generated" line of s. */
static bool nth_stats(const char *s, int k, turn_stats *t) {
    for (const char *p = s; p && (p = strstr(p, " prompt tokens: ")); p++) {
        const char *b = p;
        while (b > s && b[-1] != '[') b--;
        if (k-- > 0) continue;
        return sscanf(b, "%d prompt tokens: %d reused, %d new; %d generated", &t->prompt, &t->reused, &t->fresh,
                      &t->generated) == 4;
    }
    return false;
}

/* ---- through a pipe --------------------------------------------------------------------------- */

/* Two turns from a pipe: the second feeds only its new tokens (the first
 * turn's prompt and answer are reused from the held sequence, all but the
 * answer's last token, which was sampled but never fed); /save writes the
 * messages; /reset says so and starts over with nothing reused; stderr of a
 * pipe carries no progress line. */
LM_TEST(cli_chat_pipe_reuses_the_conversation) {
    char *dir = lm_tu_mkdir("chat_pipe");
    char cmd[4096], save[1100];
    snprintf(save, sizeof save, "%s/conv.json", dir);
    snprintf(cmd, sizeof cmd,
             "printf 'Write a function add\\nNow one called mul\\n/save %s\\n/help\\n/reset\\nhello\\n' | "
             "'%s' chat --temp 0 -n 24 --device cpu --stats",
             save, lm_test_lumen_bin());
    char *out = NULL, *err = NULL;
    int rc = lm_tu_run(cmd, &out, &err);
    LM_CHECK_MSG(rc == 0, "exit %d: %s", rc, err);
    turn_stats t1 = { 0 }, t2 = { 0 }, t3 = { 0 };
    LM_CHECK_MSG(nth_stats(err, 0, &t1) && nth_stats(err, 1, &t2) && nth_stats(err, 2, &t3), "stats: %s", err);
    LM_CHECK(t1.reused == 0 && t1.fresh == t1.prompt && t1.generated >= 1);
    /* turn 2 holds turn 1's prompt and answer: only the new text is fed */
    LM_CHECK_MSG(t2.reused == t1.prompt + t1.generated - 1, "turn 2 reused %d of turn 1's %d + %d", t2.reused,
                 t1.prompt, t1.generated);
    LM_CHECK_MSG(t2.fresh > 0 && t2.fresh < 24, "turn 2 fed %d new tokens", t2.fresh);
    LM_CHECK(t2.prompt == t2.reused + t2.fresh);
    LM_CHECK(t3.reused == 0); /* after /reset */
    LM_CHECK(err && strstr(err, "[conversation cleared]"));
    LM_CHECK(err && strstr(err, "/save FILE"));
    LM_CHECK(err && !strchr(err, '\r') && !strstr(err, "ready in") && !strstr(err, "loading"));
    json_error_t je;
    json_t *j = json_load_file(save, 0, &je);
    LM_CHECK_MSG(j && json_is_array(j) && json_array_size(j) == 4, "%s: %s", save, je.text);
    static const char *const roles[] = { "user", "assistant", "user", "assistant" };
    for (size_t i = 0; j && i < json_array_size(j) && i < 4; i++)
        LM_CHECK(lm_streq(json_string_value(json_object_get(json_array_get(j, i), "role")), roles[i]));
    LM_CHECK(j && lm_streq(json_string_value(json_object_get(json_array_get(j, 2), "content")), "Now one called mul"));
    json_decref(j);
    free(out);
    free(err);
    free(dir);
}

/* A model without a chat template is refused with the way out, which works. */
LM_TEST(cli_chat_template_option) {
    char *gguf = lm_test_fixture_path("models/llama-2-tiny-random.gguf");
    if (!gguf) LM_SKIP("%s", lm_test_fixtures_why());
    char *dir = lm_tu_mkdir("chat_tpl");
    char tpl[1100], cmd[4096];
    snprintf(tpl, sizeof tpl, "%s/t.jinja", dir);
    const char *src = "{% if tools %}<tools>{{ tools | tojson }}</tools>\n{% endif %}"
                      "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
                      "{% if add_generation_prompt %}<assistant>{% endif %}";
    LM_CHECK(lm_tu_write(tpl, src, strlen(src)) == 0);
    char *out = NULL, *err = NULL;
    snprintf(cmd, sizeof cmd, "echo hi | '%s' chat -m '%s' -n 4 --device cpu", lm_test_lumen_bin(), gguf);
    int rc = lm_tu_run(cmd, &out, &err);
    LM_CHECK_MSG(rc == 1 && err && strstr(err, "--chat-template FILE"), "exit %d: %s", rc, err);
    free(out), free(err);
    snprintf(cmd, sizeof cmd, "printf 'hi\\nmore\\n' | '%s' chat -m '%s' -n 4 --temp 0 --device cpu --stats "
             "--chat-template '%s' --system 'Be brief.'", lm_test_lumen_bin(), gguf, tpl);
    rc = lm_tu_run(cmd, &out, &err);
    LM_CHECK_MSG(rc == 0, "exit %d: %s", rc, err);
    turn_stats t1 = { 0 }, t2 = { 0 };
    LM_CHECK_MSG(nth_stats(err, 0, &t1) && nth_stats(err, 1, &t2), "%s", err);
    LM_CHECK(t2.reused == t1.prompt + t1.generated - 1);
    free(out), free(err);
    free(dir);
    free(gguf);
}

/* ---- through a pseudo-terminal ------------------------------------------------------------------ */

typedef struct pty_proc {
    int fd;
    pid_t pid;
    char *buf; /* everything the terminal showed, NUL-terminated */
    size_t len, cap;
} pty_proc;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Reads what is there within wait_s; false at end of output. */
static bool pty_pump(pty_proc *p, double wait_s) {
    struct pollfd pf = { .fd = p->fd, .events = POLLIN };
    if (poll(&pf, 1, (int)(wait_s * 1000)) <= 0) return true;
    if (p->len + 4097 > p->cap) p->buf = realloc(p->buf, p->cap = (p->len + 4097) * 2);
    ssize_t n = read(p->fd, p->buf + p->len, 4096);
    if (n <= 0) return false;
    p->len += (size_t)n;
    p->buf[p->len] = 0;
    return true;
}

/* Waits until needle shows up at or after offset from; its end offset, or -1. */
static long pty_expect(pty_proc *p, size_t from, const char *needle, double timeout_s) {
    double t_end = now_s() + timeout_s;
    for (;;) {
        const char *at = from <= p->len && p->buf ? strstr(p->buf + from, needle) : NULL;
        if (at) return (long)(at - p->buf) + (long)strlen(needle);
        if (now_s() > t_end || !pty_pump(p, 0.05)) return -1;
    }
}

static void pty_send(pty_proc *p, const char *s) {
    size_t n = strlen(s);
    while (n) {
        ssize_t w = write(p->fd, s, n);
        if (w <= 0 && errno != EINTR) return;
        if (w > 0) s += w, n -= (size_t)w;
    }
}

/* Waits until the line editor holds the terminal (ISIG and ICANON off: a
 * key typed now reaches it, not the cooked line discipline); false after
 * timeout_s. Keys sent earlier may still be cooked: ^C would be a signal. */
static bool pty_editing(pty_proc *p, double timeout_s) {
    double t_end = now_s() + timeout_s;
    for (;;) {
        struct termios t;
        if (tcgetattr(p->fd, &t) == 0 && !(t.c_lflag & (ISIG | ICANON))) return true;
        if (now_s() > t_end) return false;
        pty_pump(p, 0.01);
    }
}

/* The child's exit status, or -1 (killed) after timeout_s. */
static int pty_wait(pty_proc *p, double timeout_s) {
    double t_end = now_s() + timeout_s;
    int st = 0;
    for (;;) {
        pid_t w = waitpid(p->pid, &st, WNOHANG);
        if (w == p->pid) return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        if (now_s() > t_end) {
            kill(p->pid, SIGKILL);
            waitpid(p->pid, &st, 0);
            return -1;
        }
        pty_pump(p, 0.05);
    }
}

/* A person at a terminal: the line is edited with the arrow keys (the
 * message sent is the edited one), an earlier line comes back with Up,
 * Ctrl-C stops a running answer and the prompt returns with the
 * conversation kept (the next turn reuses all of it), Ctrl-C on a typed line
 * drops it, Ctrl-C on an empty line leaves; the history file keeps the lines
 * sent; loading showed its progress line. */
LM_TEST(cli_chat_terminal_editing_and_ctrl_c) {
    char *home = lm_tu_mkdir("chat_pty");
    char save[1100], hist[1100], env_home[1100];
    snprintf(save, sizeof save, "%s/conv.json", home);
    snprintf(hist, sizeof hist, "%s/.lumen_history", home);
    snprintf(env_home, sizeof env_home, "HOME=%s", home);
    char *const argv[] = { (char *)lm_test_lumen_bin(), "chat", "--temp", "0", "-n", "3000", "--ignore-eos",
                           "--device", "cpu", "--threads", "1", NULL };
    char *const envp[] = { env_home, "TERM=xterm", "PATH=/usr/bin:/bin", NULL };
    struct winsize ws = { .ws_row = 40, .ws_col = 120 };
    pty_proc p = { 0 };
    p.pid = forkpty(&p.fd, NULL, NULL, &ws);
    if (p.pid == 0) {
        execve(argv[0], argv, envp);
        _exit(127);
    }
    LM_CHECK(p.pid > 0);
    if (p.pid <= 0) return;
    long at = pty_expect(&p, 0, "ready in", 60);
    LM_CHECK_MSG(at > 0, "no progress line: %s", p.buf);
    at = pty_expect(&p, 0, "> ", 60);
    LM_CHECK_MSG(at > 0, "no prompt: %s", p.buf);
    /* type "abc", two steps left, "X": the message is "aXbc" */
    LM_CHECK(pty_editing(&p, 30));
    pty_send(&p, "abc\033[D\033[DX\r");
    size_t mark = p.len;
    for (double t = now_s(); p.len < mark + 300 && now_s() - t < 60;) pty_pump(&p, 0.05); /* the answer streams */
    pty_send(&p, "\003");
    long stop1 = pty_expect(&p, mark, "[stopped]", 30);
    LM_CHECK_MSG(stop1 > 0, "Ctrl-C did not stop the answer: %s", p.buf + mark);
    at = stop1 > 0 ? pty_expect(&p, (size_t)stop1, "> ", 30) : -1;
    LM_CHECK_MSG(at > 0, "no prompt after Ctrl-C: %s", p.buf + mark);
    /* Up brings "aXbc" back: a second turn, stopped the same way */
    if (at > 0) {
        LM_CHECK(pty_editing(&p, 30));
        pty_send(&p, "\033[A\r");
        mark = p.len;
        for (double t = now_s(); p.len < mark + 300 && now_s() - t < 60;) pty_pump(&p, 0.05);
        pty_send(&p, "\003");
        long stop2 = pty_expect(&p, mark, "[stopped]", 30);
        LM_CHECK_MSG(stop2 > 0, "second answer not stopped: %s", p.buf + mark);
        at = stop2 > 0 ? pty_expect(&p, (size_t)stop2, "> ", 30) : -1;
        LM_CHECK(at > 0);
    }
    turn_stats t1 = { 0 }, t2 = { 0 };
    LM_CHECK_MSG(nth_stats(p.buf, 0, &t1) && nth_stats(p.buf, 1, &t2), "%s", p.buf);
    LM_CHECK_MSG(t2.reused == t1.prompt + t1.generated - 1 && t2.fresh < 24, "turn 2: %d reused, %d new; turn 1: %d + %d",
                 t2.reused, t2.fresh, t1.prompt, t1.generated);
    if (at > 0) {
        char line[1200];
        snprintf(line, sizeof line, "/save %s\r", save);
        LM_CHECK(pty_editing(&p, 30));
        pty_send(&p, line);
        long saved = pty_expect(&p, (size_t)at, "[saved 4 messages", 30);
        LM_CHECK(saved > 0);
        LM_CHECK(saved > 0 && pty_expect(&p, (size_t)saved, "> ", 30) > 0);
        /* a typed line dropped by Ctrl-C, then Ctrl-C on the empty line leaves */
        LM_CHECK(pty_editing(&p, 30));
        size_t m2 = p.len;
        pty_send(&p, "junk\003");
        LM_CHECK(pty_expect(&p, m2, "> ", 30) > 0);
        LM_CHECK(pty_editing(&p, 30));
        pty_send(&p, "\003");
    }
    int rc = pty_wait(&p, 30);
    if (getenv("CHAT_PTY_DUMP")) lm_tu_write(getenv("CHAT_PTY_DUMP"), p.buf, p.len);
    LM_CHECK_MSG(rc == 0, "exit %d: %s", rc, p.buf);
    close(p.fd);
    json_t *j = json_load_file(save, 0, NULL);
    LM_CHECK(j && json_array_size(j) == 4);
    LM_CHECK(j && lm_streq(json_string_value(json_object_get(json_array_get(j, 0), "content")), "aXbc"));
    LM_CHECK(j && lm_streq(json_string_value(json_object_get(json_array_get(j, 2), "content")), "aXbc"));
    LM_CHECK(j && lm_streq(json_string_value(json_object_get(json_array_get(j, 1), "role")), "assistant"));
    json_decref(j);
    char *h = lm_tu_read(hist, NULL);
    LM_CHECK_MSG(h && strstr(h, "aXbc") && strstr(h, "/save") && !strstr(h, "junk"), "history: %s", h);
    free(h);
    free(p.buf);
    free(home);
}

/* lumen serve takes --chat-template too: a model without a template gets
 * no /v1/chat/completions, and with one it answers; /v1/models reads its
 * capabilities (chat, tools) from the template in use. */
LM_TEST(serve_chat_template_option) {
    char *gguf = lm_test_fixture_path("models/llama-2-tiny-random.gguf");
    if (!gguf) LM_SKIP("%s", lm_test_fixtures_why());
    char *dir = lm_tu_mkdir("serve_tpl");
    char tpl[1100], extra[1400];
    snprintf(tpl, sizeof tpl, "%s/t.jinja", dir);
    const char *src = "{% if tools %}<tools>{{ tools | tojson }}</tools>\n{% endif %}"
                      "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
                      "{% if add_generation_prompt %}<assistant>{% endif %}";
    LM_CHECK(lm_tu_write(tpl, src, strlen(src)) == 0);
    const char *body = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":3}";
    for (int with = 0; with < 2; with++) {
        snprintf(extra, sizeof extra, "--threads 1 --device cpu %s%s%s", with ? "--chat-template '" : "",
                 with ? tpl : "", with ? "'" : "");
        gu_server s;
        if (gu_server_start(&s, gguf, extra)) {
            gu_server_dump_log(&s);
            LM_CHECK(!"server started");
            break;
        }
        gu_resp r = { 0 };
        LM_CHECK(gu_http(s.port, "POST", "/v1/chat/completions", body, NULL, &r) == 0);
        LM_CHECK_MSG(r.status == (with ? 200 : 400), "with template %d: %d %s", with, r.status, r.body);
        gu_resp_free(&r);
        LM_CHECK(gu_http(s.port, "GET", "/v1/models", NULL, NULL, &r) == 0 && r.status == 200);
        json_t *models = json_loadb(r.body, r.body_len, 0, NULL);
        json_t *caps = json_object_get(json_array_get(json_object_get(models, "data"), 0), "capabilities");
        bool chat = false, tools = false;
        for (size_t i = 0; i < json_array_size(caps); i++) {
            chat |= lm_streq(json_string_value(json_array_get(caps, i)), "chat");
            tools |= lm_streq(json_string_value(json_array_get(caps, i)), "tools");
        }
        LM_CHECK_MSG(chat == with && tools == with, "with template %d: %s", with, r.body);
        json_decref(models);
        gu_resp_free(&r);
        LM_CHECK(gu_server_stop(&s) == 0);
    }
    free(dir);
    free(gguf);
}

/* A line that is not UTF-8 (pasted in Latin-1) still makes a turn: its bad
 * byte becomes U+FFFD in the messages, which stay in step (user, assistant). */
LM_TEST(cli_chat_non_utf8_line) {
    char *dir = lm_tu_mkdir("chat_latin1");
    char cmd[4096], save[1100];
    snprintf(save, sizeof save, "%s/conv.json", dir);
    snprintf(cmd, sizeof cmd, "printf 'caf\\351 au lait\\n/save %s\\n' | '%s' chat --temp 0 -n 4 --device cpu", save,
             lm_test_lumen_bin());
    char *err = NULL;
    int rc = lm_tu_run(cmd, NULL, &err);
    LM_CHECK_MSG(rc == 0, "exit %d: %s", rc, err);
    json_t *j = json_load_file(save, 0, NULL);
    LM_CHECK(j && json_array_size(j) == 2);
    LM_CHECK(j && lm_streq(json_string_value(json_object_get(json_array_get(j, 0), "content")), "caf\xEF\xBF\xBD au lait"));
    LM_CHECK(j && lm_streq(json_string_value(json_object_get(json_array_get(j, 1), "role")), "assistant"));
    json_decref(j);
    free(err);
    free(dir);
}
