/*
 * sandcell-init: pid 1 of a cold run's sandbox (namespaces backend), in place of the boot's
 * Python supervisor.
 *
 * Usage (inside the sandbox, as bubblewrap's --as-pid-1 command):
 *
 *     /sandcell/init PROGRAM [ARGS...]
 *
 * With SANDCELL_STATUS_FD=N in its environment: fork; the child runs PROGRAM (the boot, which
 * then runs the user's program in its own process, without forking a supervisor of its own)
 * with that variable removed from its environment; this process stays, outside the program's
 * Landlock domain, reaps every process of the run (orphans are reparented to pid 1) and, once
 * the child ends, writes its raw wait status ("W<status>\n") on descriptor N and exits as the
 * child did (128 + signal for a signal). Only a process that waits for the child knows whether
 * it was killed by a signal or exited with 128 + that signal: bubblewrap reports both alike.
 *
 * Without the variable (the boot must fork a supervisor of its own: it starts an egress bridge
 * or an ingress agent as children of pid 1 first) it becomes PROGRAM (execve), so the boot is pid 1
 * exactly as without this file.
 *
 * Why C: the boot's own supervisor is a fork of a Python interpreter, whose child then copies
 * every page it writes (about 3 ms of CPU per run on the development host, the largest cost of
 * a cold run over bare bubblewrap's); this process forks nothing but itself. Built from this
 * file by the host's C compiler (backends/host/native_init.py), statically linked, since the
 * sandbox's runtime need not have its dynamic loader; the boot's Python supervisor stays the
 * fallback wherever it cannot be built.
 *
 * Exit status 125 and a "sandcell-init:" line on stderr when it cannot start the program.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define BOOT_FAILED 125
#define STATUS_ENV "SANDCELL_STATUS_FD"

extern char **environ;

static void fail(const char *what, const char *detail) {
    dprintf(2, "sandcell-init: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    _exit(BOOT_FAILED);
}

/* Every descriptor but keep: the program's stdio stay with the child (held here, the host would
 * wait for them until this process exits, which it does right after the child anyway). */
static void close_all_but(int keep) {
    long max = sysconf(_SC_OPEN_MAX);
    if (max < 0 || max > 1 << 20) max = 1 << 20;
#ifdef SYS_close_range
    if (keep > 0 && syscall(SYS_close_range, 0U, (unsigned)keep - 1, 0U) == 0 &&
        syscall(SYS_close_range, (unsigned)keep + 1, ~0U, 0U) == 0)
        return;
#endif
    for (long fd = 0; fd < max; fd++)
        if (fd != keep) close((int)fd);
}

int main(int argc, char **argv) {
    if (argc < 2) fail("usage: init PROGRAM [ARGS...]", NULL);
    const char *fd_text = getenv(STATUS_ENV);
    if (fd_text == NULL) {
        execve(argv[1], argv + 1, environ);
        fail("exec", strerror(errno));
    }
    char *end;
    errno = 0;
    long status_fd = strtol(fd_text, &end, 10);
    if (errno != 0 || end == fd_text || *end != '\0' || status_fd < 3 || status_fd > 1 << 20)
        fail("malformed " STATUS_ENV, fd_text);
    if (unsetenv(STATUS_ENV) != 0) fail("unsetenv", strerror(errno));

    pid_t child = fork();
    if (child < 0) fail("fork", strerror(errno));
    if (child == 0) {
        execve(argv[1], argv + 1, environ);
        fail("exec", strerror(errno));
    }
    close_all_but((int)status_fd);
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, 0);
        if (pid < 0) {
            if (errno == EINTR) continue;
            _exit(BOOT_FAILED); /* no child left: cannot happen while the child is not reaped */
        }
        if (pid != child) continue; /* an orphan of the run, reaped */
        char line[32];
        int n = snprintf(line, sizeof line, "W%d\n", status);
        /* The host falls back to bubblewrap's exit status if this write fails. */
        if (n > 0) (void)!write((int)status_fd, line, (size_t)n);
        _exit(WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status));
    }
}
