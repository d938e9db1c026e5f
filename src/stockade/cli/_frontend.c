/*
 * The compiled front end of the `stockade` command.
 *
 * `stockade run` hands its run to a warm `stockade server` when one of this user and this
 * installation listens (docs/server.md). In Python, that hand-over starts with the
 * interpreter's own start-up, about a third of a served run; this program does the same
 * hand-over without it. Everything else (other verbs, no server, a server that declines)
 * is left to the Python CLI, which this program becomes with execv: it never decides
 * anything about a sandbox itself, so it cannot weaken one. A declined or absent server
 * means the run happens in the Python process, under the same policy.
 *
 * The protocol is the one of stockade/cli/_client.py (PROTOCOL there); keep both in step.
 *
 * Built by stockade.cli._frontend, which prepends four definitions:
 *   STOCKADE_PYTHON    the interpreter of the installation (sys.executable)
 *   STOCKADE_KEY       the installation key (_client.installation_key())
 *   STOCKADE_PROTOCOL  the protocol version (_client.PROTOCOL)
 *   STOCKADE_MARKER    a string by which `install-frontend` recognises this binary
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef STOCKADE_PYTHON
#error "STOCKADE_PYTHON must be defined"
#endif
#ifndef STOCKADE_KEY
#error "STOCKADE_KEY must be defined"
#endif
#ifndef STOCKADE_PROTOCOL
#error "STOCKADE_PROTOCOL must be defined"
#endif
#ifndef STOCKADE_MARKER
#error "STOCKADE_MARKER must be defined"
#endif

__attribute__((used)) static const char marker[] = STOCKADE_MARKER;

#define DECLINED (-1)
#define EXIT_STOCKADE_ERROR 125
#define ANSWER_TIMEOUT_MS 10000

extern char **environ;

/* Messages, as in _client.py. */
#define HELLO 'H'
#define ACCEPTED 'A'
#define REFUSED 'R'
#define EXITED 'X'
#define SIGNAL_MSG 'S'

static const int forwarded_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGWINCH};
static const int inherited_ignores[] = {SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1,
                                        SIGUSR2, SIGTSTP, SIGTTIN, SIGTTOU};
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* The Python CLI, with this process's arguments; `tried` says a server was asked. */
static void become_python(int argc, char **argv, int tried)
{
    char **args = calloc((size_t)argc + 4, sizeof(char *));
    if (args == NULL) {
        perror("stockade: calloc");
        exit(EXIT_STOCKADE_ERROR);
    }
    /* -P: no directory of the caller's (the workspace) on sys.path before the package. */
    args[0] = STOCKADE_PYTHON;
    args[1] = "-P";
    args[2] = "-c";
    args[3] = "import sys; from stockade.cli import main; sys.exit(main())";
    for (int i = 1; i < argc; i++)
        args[3 + i] = argv[i];
    /* The server was asked once: the Python CLI must not ask again. */
    if (tried && setenv("STOCKADE_SERVER", "0", 1) != 0) {
        perror("stockade: setenv");
        exit(EXIT_STOCKADE_ERROR);
    }
    execv(STOCKADE_PYTHON, args);
    fprintf(stderr, "stockade: cannot start %s: %s\n", STOCKADE_PYTHON, strerror(errno));
    exit(EXIT_STOCKADE_ERROR);
}

/* A growing byte buffer for the request; failure to grow is fatal (nothing sent yet). */
struct buf {
    char *data;
    size_t len, cap;
};

static int put(struct buf *b, const void *data, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *grown = realloc(b->data, cap);
        if (grown == NULL)
            return -1;
        b->data = grown;
        b->cap = cap;
    }
    memcpy(b->data + b->len, data, n);
    b->len += n;
    return 0;
}

/* One NUL-terminated field. */
static int field(struct buf *b, const char *s)
{
    return put(b, s, strlen(s) + 1);
}

static int number(struct buf *b, long long n)
{
    char text[32];
    snprintf(text, sizeof text, "%lld", n);
    return field(b, text);
}

static int timeout_ms(void)
{
    const char *text = getenv("STOCKADE_SERVER_TIMEOUT");
    if (text == NULL || *text == '\0')
        return ANSWER_TIMEOUT_MS;
    char *end;
    errno = 0;
    double seconds = strtod(text, &end);
    if (errno != 0 || *end != '\0' || !(seconds > 0) || seconds > 86400)
        return ANSWER_TIMEOUT_MS;
    return (int)(seconds * 1000 + 0.5) > 0 ? (int)(seconds * 1000 + 0.5) : 1;
}

/* The server's next byte: the byte, 0 when it closed, -1 when it said nothing in time. */
static int answer(int sock, int wait_ms)
{
    struct pollfd p = {.fd = sock, .events = POLLIN};
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        long spent = (now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000;
        if (spent >= wait_ms)
            return -1;
        int ready = poll(&p, 1, (int)(wait_ms - spent));
        if (ready < 0 && errno == EINTR)
            continue;
        if (ready < 0)
            return 0;
        if (ready == 0)
            return -1;
        unsigned char byte;
        ssize_t n = recv(sock, &byte, 1, 0);
        if (n < 0 && errno == EINTR)
            continue;
        return n == 1 ? byte : 0;
    }
}

static void declined(int sock, int reply)
{
    const char *debug = getenv("STOCKADE_DEBUG");
    if (reply != REFUSED || debug == NULL || *debug == '\0')
        return;
    char reason[4096];
    size_t len = 0;
    while (len < sizeof reason - 1) {
        ssize_t n = recv(sock, reason + len, sizeof reason - 1 - len, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        len += (size_t)n;
        if (memchr(reason, '\n', len) != NULL)
            break;
    }
    reason[len] = '\0';
    char *newline = strchr(reason, '\n');
    if (newline != NULL)
        *newline = '\0';
    fprintf(stderr, "stockade: the run server declined (%s); running here\n", reason);
}

/* The path of this installation's server file with `suffix` (".sock", ".lock", ".log"),
 * or -1 when it does not fit in `size` bytes or no directory can be named. */
static int server_file(char *out, size_t size, const char *suffix)
{
    const char *state = getenv("XDG_STATE_HOME");
    int n;
    if (state != NULL && *state != '\0') {
        n = snprintf(out, size, "%s/stockade/server/%s%s", state, STOCKADE_KEY, suffix);
    } else {
        /* Python's expanduser("~") without HOME asks the password database; leave that
         * rare case to the Python client. */
        const char *home = getenv("HOME");
        if (home == NULL || *home == '\0')
            return -1;
        n = snprintf(out, size, "%s/.local/state/stockade/server/%s%s", home, STOCKADE_KEY,
                     suffix);
    }
    return n < 0 || (size_t)n >= size ? -1 : n;
}

/* The connection to this user's server, or -1; `nobody` is set when no server listens
 * there at all (no socket, or one a dead server left), the case an auto-start is for. */
static int connect_server(int *nobody)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    *nobody = 0;
    int n = server_file(addr.sun_path, sizeof addr.sun_path, ".sock");
    if (n < 0)
        return -1;
    int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (sock < 0)
        return -1;
    if (connect(sock, (struct sockaddr *)&addr, sizeof addr) != 0) {
        *nobody = errno == ENOENT || errno == ECONNREFUSED;
        close(sock);
        return -1;
    }
    struct ucred peer;
    socklen_t size = sizeof peer;
    if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &peer, &size) != 0 || peer.uid != geteuid()) {
        /* Only a server of this user gets our environment and descriptors. */
        close(sock);
        return -1;
    }
    return sock;
}

/* Make `path` and its missing parents; the last one mode 0700 (as the Python server's
 * _private_dir). 0, or -1 when a directory cannot be made (a read-only state
 * directory, as inside a sandbox: then nothing is started). */
static int make_dirs(char *path)
{
    for (char *p = path + 1; *p != '\0'; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        int made = mkdir(path, 0777);
        *p = '/';
        if (made != 0 && errno != EEXIST)
            return -1;
    }
    return mkdir(path, 0700) == 0 || errno == EEXIST ? 0 : -1;
}

/* Start this installation's run server in the background, on first use (docs/server.md):
 * `stockade server run` in a new session, detached from this process (the run itself
 * goes on here, in Python, meanwhile). Nothing is started when the server directory is
 * not this user's alone (0700) or cannot be written, or when a server holds its lock
 * (running, or starting). Whatever fails here only means the next run is not served. */
static void start_server(void)
{
    char dir[PATH_MAX], lock_path[PATH_MAX], log_path[PATH_MAX];
    if (server_file(lock_path, sizeof lock_path, ".lock") < 0 ||
        server_file(log_path, sizeof log_path, ".log") < 0)
        return;
    memcpy(dir, lock_path, sizeof dir);
    char *slash = strrchr(dir, '/');
    if (slash == NULL)
        return;
    *slash = '\0';
    struct stat st;
    if (make_dirs(dir) != 0 || lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode) ||
        st.st_uid != geteuid() || (st.st_mode & 077) != 0 || access(dir, W_OK) != 0)
        return;
    int lock = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (lock < 0)
        return;
    int free_now = flock(lock, LOCK_EX | LOCK_NB) == 0;
    close(lock); /* the server takes the lock itself; two starters: one of them stays */
    if (!free_now)
        return;
    pid_t child = fork();
    if (child < 0)
        return;
    if (child > 0) {
        while (waitpid(child, NULL, 0) < 0 && errno == EINTR)
            ;
        return;
    }
    /* The child: a new session, then a grandchild that is nobody's child of ours. */
    if (setsid() < 0 || fork() != 0)
        _exit(0);
    /* The caller's signal state is not the server's: it outlives this caller and forks
     * the workers of the next ones (an inherited SIGCHLD ignore would make every run's
     * exit status 0, an inherited mask or ignored SIGTERM would make it unstoppable). */
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    for (int sig = 1; sig < NSIG; sig++)
        signal(sig, SIG_DFL); /* fails harmlessly for SIGKILL, SIGSTOP and reserved ones */
    int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
    int log = open(log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (null < 0 || log < 0 || dup2(null, 0) < 0 || dup2(log, 1) < 0 || dup2(log, 2) < 0 ||
        chdir("/") != 0)
        _exit(1);
    /* Nothing of the caller's stays open in the server. */
    int closed = -1;
#ifdef SYS_close_range
    closed = (int)syscall(SYS_close_range, 3U, ~0U, 0U);
#endif
    if (closed != 0) {
        long most = sysconf(_SC_OPEN_MAX);
        for (int fd = 3; fd < (most > 0 && most < 65536 ? most : 65536); fd++)
            close(fd);
    }
    if (setenv("STOCKADE_SERVER_AUTOSTART", "1", 1) != 0)
        _exit(1);
    /* -P, as for the Python CLI: no directory of the caller's (the workspace) is on
     * sys.path of a server that outlives this caller and serves the next ones. */
    char *args[] = {STOCKADE_PYTHON, "-P", "-c",
                    "import sys; from stockade.cli import main; sys.exit(main())",
                    "server", "run", NULL};
    execv(STOCKADE_PYTHON, args);
    _exit(1);
}

/* The request: fields separated by NUL, as _client.parse_request reads them. */
static int request(struct buf *b, int argc, char **argv)
{
    mode_t mask = umask(077);
    umask(mask);
    if (field(b, "stockade-run") || number(b, STOCKADE_PROTOCOL) || number(b, mask) ||
        number(b, argc))
        return -1;
    for (int i = 0; i < argc; i++)
        if (field(b, argv[i]))
            return -1;
    long envc = 0;
    for (char **e = environ; *e != NULL; e++)
        envc++;
    if (number(b, envc))
        return -1;
    for (char **e = environ; *e != NULL; e++)
        if (field(b, *e))
            return -1;
    if (number(b, RLIMIT_NLIMITS))
        return -1;
    for (int res = 0; res < RLIMIT_NLIMITS; res++) {
        struct rlimit lim;
        if (getrlimit(res, &lim) != 0)
            return -1;
        char text[80];
        /* -1 is Python's resource.RLIM_INFINITY. */
        snprintf(text, sizeof text, "%d %lld %lld", res,
                 lim.rlim_cur == RLIM_INFINITY ? -1LL : (long long)lim.rlim_cur,
                 lim.rlim_max == RLIM_INFINITY ? -1LL : (long long)lim.rlim_max);
        if (field(b, text))
            return -1;
    }
    int ignored = 0;
    for (size_t i = 0; i < COUNT(inherited_ignores); i++) {
        struct sigaction old;
        if (sigaction(inherited_ignores[i], NULL, &old) == 0 && old.sa_handler == SIG_IGN)
            ignored++;
    }
    if (number(b, ignored))
        return -1;
    for (size_t i = 0; i < COUNT(inherited_ignores); i++) {
        struct sigaction old;
        if (sigaction(inherited_ignores[i], NULL, &old) == 0 && old.sa_handler == SIG_IGN)
            if (number(b, inherited_ignores[i]))
                return -1;
    }
    return 0;
}

static int send_all(int sock, const char *data, size_t len)
{
    while (len > 0) {
        ssize_t n = send(sock, data, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        data += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Send the request with descriptors 0, 1, 2 and the working directory. */
static int hand_over(int sock, struct buf *b)
{
    for (int fd = 0; fd < 3; fd++) {
        struct stat st;
        /* A closed descriptor is left to the in-process run to report. */
        if (fstat(fd, &st) != 0)
            return -1;
    }
    int cwd = open(".", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (cwd < 0)
        return -1;
    int fds[4] = {0, 1, 2, cwd};
    union {
        char buf[CMSG_SPACE(sizeof fds)];
        struct cmsghdr align;
    } control;
    memset(&control, 0, sizeof control);
    struct iovec iov = {.iov_base = b->data, .iov_len = b->len};
    struct msghdr msg = {
        .msg_iov = &iov,
        .msg_iovlen = 1,
        .msg_control = control.buf,
        .msg_controllen = sizeof control.buf,
    };
    struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof fds);
    memcpy(CMSG_DATA(cmsg), fds, sizeof fds);
    ssize_t sent;
    do
        sent = sendmsg(sock, &msg, MSG_NOSIGNAL);
    while (sent < 0 && errno == EINTR);
    close(cwd);
    if (sent <= 0)
        return -1;
    return send_all(sock, b->data + sent, b->len - (size_t)sent);
}

static volatile sig_atomic_t last_forwarded;
static int forward_sock = -1;

static void forward(int signum)
{
    int saved = errno;
    last_forwarded = signum;
    char message[2] = {SIGNAL_MSG, (char)signum};
    /* The worker gone, its status (or its absence) ends the wait. */
    (void)send(forward_sock, message, sizeof message, MSG_NOSIGNAL | MSG_DONTWAIT);
    errno = saved;
}

/* Forward signals until the run's exit status arrives; return it. */
static int wait_status(int sock)
{
    forward_sock = sock;
    for (size_t i = 0; i < COUNT(forwarded_signals); i++) {
        struct sigaction old, sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = forward;
        sigemptyset(&sa.sa_mask);
        if (sigaction(forwarded_signals[i], NULL, &old) == 0 && old.sa_handler != SIG_IGN)
            sigaction(forwarded_signals[i], &sa, NULL);
    }
    unsigned char status[5];
    size_t got = 0;
    while (got < sizeof status) {
        ssize_t n = recv(sock, status + got, sizeof status - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    if (got == sizeof status && status[0] == EXITED) {
        int32_t code = (int32_t)((uint32_t)status[1] << 24 | (uint32_t)status[2] << 16 |
                                 (uint32_t)status[3] << 8 | (uint32_t)status[4]);
        return code;
    }
    /* The worker ended without a status: a forwarded signal killed it before the run
     * began (end the same way), or it died; the sandbox died with it. */
    for (size_t i = 0; i < COUNT(forwarded_signals); i++)
        signal(forwarded_signals[i], SIG_DFL);
    if (last_forwarded != 0 && last_forwarded != SIGWINCH)
        kill(getpid(), last_forwarded);
    fprintf(stderr, "stockade: the run server's worker ended without an exit status\n");
    return EXIT_STOCKADE_ERROR;
}

/* Run `stockade ARGS` in the server: its exit code, or DECLINED to run it in Python
 * (`nobody`: no server listens). */
static int served(int argc, char **argv, int *nobody)
{
    int sock = connect_server(nobody);
    if (sock < 0)
        return DECLINED;
    int wait_ms = timeout_ms();
    /* First the worker's hello: nothing was sent before it, so silence or a refusal is
     * safe to answer by running the command in Python. */
    int reply = answer(sock, wait_ms);
    if (reply != HELLO) {
        declined(sock, reply);
        close(sock);
        return DECLINED;
    }
    struct buf b = {0};
    if (put(&b, "\0\0\0\0", 4) != 0 || request(&b, argc, argv) != 0) {
        free(b.data);
        close(sock);
        return DECLINED;
    }
    uint32_t size = (uint32_t)(b.len - 4);
    unsigned char be[4] = {size >> 24, size >> 16, size >> 8, size};
    memcpy(b.data, be, 4);
    int sent = hand_over(sock, &b);
    free(b.data);
    if (sent != 0) {
        close(sock);
        return DECLINED;
    }
    reply = answer(sock, wait_ms);
    if (reply < 0) {
        /* The request is the worker's now and it may have started: never run it twice. */
        fprintf(stderr,
                "stockade: the run server did not answer in %gs; the command was not run "
                "here (stop the server with 'stockade server stop', or set "
                "STOCKADE_SERVER=0)\n",
                wait_ms / 1000.0);
        close(sock);
        return EXIT_STOCKADE_ERROR;
    }
    if (reply != ACCEPTED) {
        declined(sock, reply); /* refused, or gone before accepting: nothing ran */
        close(sock);
        return DECLINED;
    }
    return wait_status(sock);
}

int main(int argc, char **argv)
{
    /* STOCKADE_SERVER: "0" never asks a server; "manual" asks one started by hand and
     * never starts one; anything else also starts one when none listens. */
    const char *mode = getenv("STOCKADE_SERVER");
    if (argc >= 2 && strcmp(argv[1], "run") == 0 && (mode == NULL || strcmp(mode, "0") != 0)) {
        int nobody = 0;
        int code = served(argc - 1, argv + 1, &nobody);
        if (code != DECLINED)
            return code;
        if (nobody && (mode == NULL || strcmp(mode, "manual") != 0))
            start_server();
        become_python(argc, argv, 1);
    }
    become_python(argc, argv, 0);
    return EXIT_STOCKADE_ERROR;
}
