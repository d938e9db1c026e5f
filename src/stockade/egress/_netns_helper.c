/*
 * stockade's network-namespace helper (egress/_netns.py runs it; see its docstring).
 *
 * Enters a sandbox's network namespace (and the user namespace that owns it, when that
 * is not ours), makes the sockets the proxy serves there, and hands them back over a
 * unix socket with SCM_RIGHTS; then exits. A socket keeps the namespace it was made in,
 * whoever holds it, so the proxy outside serves listeners inside.
 *
 * Why a program of its own, and in C: setns() into a user namespace needs a process with
 * one thread, and the proxy's process has several. A fork of a Python process of the
 * server's size cost about 3 ms on every run's path (copying page tables, then faulting
 * in every page the child's interpreter touches); this is spawned (vfork and exec) and
 * does nothing but system calls.
 *
 * It is spawned before the namespace exists (while bubblewrap builds it), so that its
 * exec is not on the run's path, and then waits for the namespace on its channel.
 *
 * Descriptors (set up by the spawner): 3 the channel. Nothing else is kept open.
 *
 * argv: helper PORT DNS PROXY ROUTES POOL_ADDR POOL_PREFIX [CAPTURE_PORT...]
 *   PORT         the proxy listener's port on 127.0.0.1 (0: the kernel picks)
 *   DNS          1: the resolver's UDP and TCP sockets on 127.0.0.1:53, and the pool's
 *                address on lo (AI_ADDRCONFIG counts IPv4 then; egress/_netns.py)
 *   PROXY        1: the proxy listener
 *   ROUTES       1: with capture ports, add "local 0.0.0.0/0" and "local ::/0" on lo
 *   POOL_ADDR    the synthetic pool's network address (dotted quad)
 *   POOL_PREFIX  its prefix length
 *   CAPTURE_PORT one dual-stack listener on the wildcard address per port
 *
 * The namespace, on the channel: one byte, "N" with one descriptor (the network
 * namespace) or "U" with two (the network namespace, then the user namespace to join
 * first). The channel closed before it: the run ended first, and the helper exits.
 *
 * Answer on the channel: "OK" with the descriptors (proxy, DNS UDP, DNS TCP, captures,
 * in that order, each present as asked), or "ERR <step>: <reason>".
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define CHANNEL 3
#define DNS_PORT 53
#define DNS_RCVBUF (1 << 20)
/* SCM_RIGHTS carries at most 253 descriptors (SCM_MAX_FD); _netns.MAX_CAPTURE_PORTS */
#define MAX_CAPTURE 200
#define MAX_FDS (MAX_CAPTURE + 3)

static const char *step = "start";

/* Report "ERR <step>: <reason>" on the channel and exit. */
static void fail(int err) {
	char msg[512];
	int n = snprintf(msg, sizeof msg, "ERR %s: %s", step, strerror(err));
	if (n > 0) {
		if (n >= (int)sizeof msg)
			n = sizeof msg - 1;
		(void)!write(CHANNEL, msg, (size_t)n);
	}
	_exit(1);
}

static int number(const char *text, long lo, long hi) {
	char *end;
	errno = 0;
	long v = strtol(text, &end, 10);
	if (errno || *text == '\0' || *end != '\0' || v < lo || v > hi) {
		step = "arguments";
		fail(EINVAL);
	}
	return (int)v;
}

/* bubblewrap brings lo up in the new namespace concurrently with us: binding 127.0.0.1
 * or routing through lo before that fails (bringing it up ourselves would make
 * bubblewrap's own request fail). Wait for it, up to 4 s: less than the 5 s the spawner
 * waits for an answer, so that it hears which step failed. */
static void wait_for_loopback(void) {
	int probe = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (probe < 0)
		fail(errno);
	struct ifreq req;
	memset(&req, 0, sizeof req);
	strncpy(req.ifr_name, "lo", IFNAMSIZ - 1);
	struct timespec start, now;
	clock_gettime(CLOCK_MONOTONIC, &start);
	for (;;) {
		if (ioctl(probe, SIOCGIFFLAGS, &req) < 0)
			fail(errno);
		if (req.ifr_flags & IFF_UP) {
			close(probe);
			return;
		}
		clock_gettime(CLOCK_MONOTONIC, &now);
		if (now.tv_sec - start.tv_sec >= 4)
			fail(ENETDOWN);
		struct timespec pause = {0, 200000};
		nanosleep(&pause, NULL);
	}
}

/* One rtnetlink request of ``type`` that creates something (``message`` starts with its
 * header, which is filled in here): the error its ACK carries (0, or a negative errno;
 * EEXIST counts as done). A failure to talk to the kernel at all ends the helper. */
static int netlink(void *message, size_t len, unsigned short type) {
	struct nlmsghdr *request = message;
	request->nlmsg_len = (unsigned)len;
	request->nlmsg_type = type;
	request->nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL;
	request->nlmsg_seq = 1;
	int nl = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
	if (nl < 0)
		fail(errno);
	if (send(nl, message, len, 0) != (ssize_t)len)
		fail(errno);
	char answer[4096];
	ssize_t n = recv(nl, answer, sizeof answer, 0);
	if (n < 0)
		fail(errno);
	close(nl);
	struct nlmsghdr *h = (struct nlmsghdr *)answer;
	if ((size_t)n < sizeof *h + sizeof(struct nlmsgerr) || h->nlmsg_type != NLMSG_ERROR)
		fail(EPROTO);
	int error = ((struct nlmsgerr *)NLMSG_DATA(h))->error;
	return error == -EEXIST ? 0 : error;
}

struct attr_int {
	struct rtattr rta;
	int value;
};

/* "local <family default> dev lo" in the local table (AnyIP: every destination is local,
 * so a connection to any address reaches a capture listener). Returns 0, or -1 when the
 * family is off in this kernel (IPv6 destinations then stay unreachable). */
static int add_local_default(int family, int lo) {
	struct {
		struct nlmsghdr h;
		struct rtmsg r;
		struct attr_int oif;
	} m;
	memset(&m, 0, sizeof m);
	m.r.rtm_family = (unsigned char)family;
	m.r.rtm_table = RT_TABLE_LOCAL;
	m.r.rtm_protocol = RTPROT_STATIC;
	m.r.rtm_scope = RT_SCOPE_HOST;
	m.r.rtm_type = RTN_LOCAL;
	m.oif.rta.rta_len = sizeof m.oif;
	m.oif.rta.rta_type = RTA_OIF;
	m.oif.value = lo;
	int error = netlink(&m, sizeof m, RTM_NEWROUTE);
	if (error == 0)
		return 0;
	if (family == AF_INET6 && (error == -EAFNOSUPPORT || error == -EOPNOTSUPP))
		return -1;
	fail(-error);
	return -1;
}

/* The pool's network address on lo (RTM_NEWADDR, IFA_LOCAL and IFA_ADDRESS). */
static void add_pool_address(struct in_addr pool, int prefix, int lo) {
	struct {
		struct nlmsghdr h;
		struct ifaddrmsg a;
		struct rtattr local;
		struct in_addr local_addr;
		struct rtattr address;
		struct in_addr address_addr;
	} m;
	memset(&m, 0, sizeof m);
	m.a.ifa_family = AF_INET;
	m.a.ifa_prefixlen = (unsigned char)prefix;
	m.a.ifa_scope = RT_SCOPE_HOST;
	m.a.ifa_index = (unsigned)lo;
	m.local.rta_len = RTA_LENGTH(sizeof(struct in_addr));
	m.local.rta_type = IFA_LOCAL;
	m.local_addr = pool;
	m.address.rta_len = RTA_LENGTH(sizeof(struct in_addr));
	m.address.rta_type = IFA_ADDRESS;
	m.address_addr = pool;
	int error = netlink(&m, sizeof m, RTM_NEWADDR);
	if (error != 0)
		fail(-error);
}

/* Bind ``s`` to an IPv4 address (host order) and port; the helper ends on failure. */
static void bind4(int s, uint32_t address, int port) {
	struct sockaddr_in a;
	memset(&a, 0, sizeof a);
	a.sin_family = AF_INET;
	a.sin_port = htons((unsigned short)port);
	a.sin_addr.s_addr = htonl(address);
	if (bind(s, (struct sockaddr *)&a, sizeof a) < 0)
		fail(errno);
}

static int listener4(int type, int port, int backlog) {
	int s = socket(AF_INET, type | SOCK_CLOEXEC, 0);
	if (s < 0)
		fail(errno);
	int one = 1;
	if (type == SOCK_STREAM && setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0)
		fail(errno);
	if (type == SOCK_DGRAM) {
		int size = DNS_RCVBUF;
		/* a burst of queries is queued, not dropped */
		if (setsockopt(s, SOL_SOCKET, SO_RCVBUF, &size, sizeof size) < 0)
			fail(errno);
	}
	bind4(s, INADDR_LOOPBACK, port);
	if (type == SOCK_STREAM && listen(s, backlog) < 0)
		fail(errno);
	return s;
}

/* A listener on every address: dual-stack IPv6 (IPv4 arrives as ::ffff:a.b.c.d), or IPv4
 * alone where the kernel has no IPv6. */
static int capture_listener(int port) {
	int one = 1, zero = 0;
	int s = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (s < 0) {
		s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (s < 0 || setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0)
			fail(errno);
		bind4(s, INADDR_ANY, port);
	} else {
		if (setsockopt(s, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero) < 0 ||
			setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0)
			fail(errno);
		struct sockaddr_in6 a;
		memset(&a, 0, sizeof a);
		a.sin6_family = AF_INET6;
		a.sin6_port = htons((unsigned short)port);
		a.sin6_addr = in6addr_any;
		if (bind(s, (struct sockaddr *)&a, sizeof a) < 0)
			fail(errno);
	}
	if (listen(s, 1024) < 0)
		fail(errno);
	return s;
}

/* Wait for the namespace (see the header): its descriptors in *net and *user (-1: stay
 * in our user namespace). */
static void receive_namespace(int *net, int *user) {
	char kind;
	struct iovec iov = {&kind, 1};
	union {
		char buf[CMSG_SPACE(sizeof(int) * 2)];
		struct cmsghdr align;
	} control;
	struct msghdr msg;
	memset(&msg, 0, sizeof msg);
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
	msg.msg_control = control.buf;
	msg.msg_controllen = sizeof control.buf;
	step = "receive the namespace";
	ssize_t n;
	do
		n = recvmsg(CHANNEL, &msg, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n == 0)
		_exit(0);
	if (n < 0)
		fail(errno);
	int fds[2] = {-1, -1}, count = 0;
	struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
	if (c != NULL && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
		count = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
		if (count > 2)
			fail(EPROTO);
		memcpy(fds, CMSG_DATA(c), sizeof(int) * (size_t)count);
	}
	if ((msg.msg_flags & MSG_CTRUNC) || count != (kind == 'U' ? 2 : kind == 'N' ? 1 : -1))
		fail(EPROTO);
	*net = fds[0];
	*user = fds[1];
}

int main(int argc, char **argv) {
	if (argc < 7) {
		step = "arguments";
		fail(EINVAL);
	}
	/* Nothing of the spawner's but ours: a descriptor that was not close-on-exec in a
	 * threaded parent must not ride into the sandbox's namespace. */
	if (syscall(SYS_close_range, CHANNEL + 1, ~0U, 0) < 0)
		for (int fd = CHANNEL + 1; fd < 1024; fd++)
			close(fd);
	int port = number(argv[1], 0, 65535);
	int dns = number(argv[2], 0, 1);
	int proxy = number(argv[3], 0, 1);
	int routes = number(argv[4], 0, 1);
	struct in_addr pool;
	if (inet_pton(AF_INET, argv[5], &pool) != 1) {
		step = "arguments";
		fail(EINVAL);
	}
	int prefix = number(argv[6], 1, 32);
	int ncapture = argc - 7;
	if (ncapture > MAX_CAPTURE) {
		step = "arguments";
		fail(E2BIG);
	}
	/* Every argument is checked before the namespace is waited for: a bad one is
	 * reported at once, not after the sandbox has started. */
	for (int i = 0; i < ncapture; i++)
		(void)number(argv[7 + i], 1, 65535);
	int fds[MAX_FDS], nfds = 0;

	int net, user;
	receive_namespace(&net, &user);
	step = "setns(user)";
	if (user >= 0 && setns(user, CLONE_NEWUSER) < 0)
		fail(errno);
	step = "setns(net)";
	if (setns(net, CLONE_NEWNET) < 0)
		fail(errno);
	step = "wait for lo";
	wait_for_loopback();
	int lo = (int)if_nametoindex("lo");
	if (lo == 0)
		fail(errno);
	if (ncapture > 0 && routes) {
		step = "route add local 0.0.0.0/0 dev lo";
		add_local_default(AF_INET, lo);
		step = "route add local ::/0 dev lo";
		add_local_default(AF_INET6, lo);
	}
	char where[64];
	if (dns) {
		step = "address add pool dev lo";
		add_pool_address(pool, prefix, lo);
	}
	if (proxy) {
		snprintf(where, sizeof where, "bind 127.0.0.1:%d", port);
		step = where;
		fds[nfds++] = listener4(SOCK_STREAM, port, 1024);
	}
	if (dns) {
		step = "bind udp 127.0.0.1:53";
		fds[nfds++] = listener4(SOCK_DGRAM, DNS_PORT, 0);
		step = "bind tcp 127.0.0.1:53";
		fds[nfds++] = listener4(SOCK_STREAM, DNS_PORT, 128);
	}
	for (int i = 0; i < ncapture; i++) {
		int p = number(argv[7 + i], 1, 65535);
		snprintf(where, sizeof where, "bind [::]:%d", p);
		step = where;
		fds[nfds++] = capture_listener(p);
	}

	step = "send fds";
	char ok[2] = {'O', 'K'};
	struct iovec iov = {ok, sizeof ok};
	union {
		char buf[CMSG_SPACE(sizeof(int) * MAX_FDS)];
		struct cmsghdr align;
	} control;
	memset(&control, 0, sizeof control);
	struct msghdr msg;
	memset(&msg, 0, sizeof msg);
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
	if (nfds > 0) {
		msg.msg_control = control.buf;
		msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
		struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
	}
	if (sendmsg(CHANNEL, &msg, 0) < 0)
		fail(errno);
	return 0;
}
