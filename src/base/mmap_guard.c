/* mmap_guard.c - a file changed underneath its mapping is a clear error.
 *
 * Design note
 * -----------
 * Model files are mapped, not read (lm_mmap_open). When such a file is
 * truncated or rewritten while mapped (a download replacing it, a copy
 * onto it), touching a page past its new end raises SIGBUS, which kills
 * the process with no word. A SIGBUS handler cannot repair the read, so
 * this one only explains it: when the faulting address lies in a mapped
 * file it writes "PATH changed while lumen was using it" to stderr and
 * exits with status 1; any other SIGBUS gets the default action.
 *
 * The handler reads a fixed table of mappings without locks (a signal
 * handler may not take them): a slot is filled completely before its
 * address is published with an atomic store, and emptied by storing a null
 * address first. The table is process-wide by necessity (signal handlers
 * are); it only describes mappings, it never owns them. */
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "lm_file.h"

#define GUARD_SLOTS 64
#define GUARD_PATH 256

typedef struct guard_slot {
    _Atomic(uintptr_t) addr;  /* 0: free */
    size_t size;
    char path[GUARD_PATH];
} guard_slot;

static guard_slot g_slots[GUARD_SLOTS];
static atomic_flag g_installed = ATOMIC_FLAG_INIT;

static void say(const char *s) {
    ssize_t w = write(2, s, strlen(s));
    (void)w;
}

static void on_sigbus(int sig, siginfo_t *si, void *uc) {
    (void)uc;
    uintptr_t a = (uintptr_t)si->si_addr;
    for (int i = 0; i < GUARD_SLOTS; i++) {
        uintptr_t base = atomic_load(&g_slots[i].addr);
        if (!base || a < base || a - base >= g_slots[i].size) continue;
        say("lumen: ");
        say(g_slots[i].path);
        say(" changed while lumen was using it (truncated or rewritten underneath its memory map); "
            "its data can no longer be read. Stopping; restart lumen once the file is complete.\n");
        _exit(1); /* the faulting read cannot be completed: no way back to the caller */
    }
    signal(sig, SIG_DFL); /* not a mapped file: the default action, on return */
}

static void install(void) {
    if (atomic_flag_test_and_set(&g_installed)) return;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, NULL);
}

void lm_mmap_guard_add(const void *addr, size_t size, const char *path) {
    install();
    for (int i = 0; i < GUARD_SLOTS; i++) {
        guard_slot *s = &g_slots[i];
        if (atomic_load(&s->addr)) continue;
        s->size = size;
        size_t n = strlen(path);
        if (n >= GUARD_PATH) path += n - (GUARD_PATH - 1); /* the end of a long path names the file */
        memcpy(s->path, path, strlen(path) + 1);
        uintptr_t zero = 0;
        if (atomic_compare_exchange_strong(&s->addr, &zero, (uintptr_t)addr)) return;
    }
    /* more than GUARD_SLOTS files mapped at once: the rest fault unexplained */
}

void lm_mmap_guard_remove(const void *addr) {
    for (int i = 0; i < GUARD_SLOTS; i++) {
        uintptr_t want = (uintptr_t)addr;
        if (atomic_compare_exchange_strong(&g_slots[i].addr, &want, 0)) return;
    }
}
