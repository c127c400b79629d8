"""Network namespaces as "hosts" for bench/slow_network.py. Not a benchmark itself.

Hosts(n) creates, for the calling process (names and subnet derived from its PID):
  - n namespaces  krab-slow-PID-h0 .. h{n-1}  (the hosts), each with `lo` up and one veth end
    ksPIDh{i} holding the address 10.214.S.{i+1}/24 (S = 1 + PID % 250);
  - one more namespace  krab-slow-PID-br  with a Linux bridge ksPIDbr whose ports are the other
    veth ends ksPIDp{i}. The veth pairs are created from inside that namespace with their host
    end placed straight into the host's namespace, so nothing is ever added to the root
    namespace (no interface, no route, no address).
shape(rate_mbit) puts `tc qdisc tbf` on each host's veth (its egress = its upload), or removes
it (None). Traffic between hosts crosses exactly one shaped queue, the sender's; the bridge's
ports are not shaped.

down() (also on `with` exit) kills every process still inside those namespaces and deletes the
namespaces, which deletes the veths and the bridge with them. remove_stale() removes namespaces
of this naming scheme whose creating PID no longer exists (left by a run killed with SIGKILL).
Needs root, `ip` and `tc` (iproute2).
"""
import json
import os
import re
import signal
import subprocess

PREFIX = "krab-slow-"
_STALE = re.compile(r"^krab-slow-(\d+)-(h\d+|br)$")


class NetError(RuntimeError):
    pass


def sh(cmd, timeout=20, check=True):
    """Runs a short administrative command; raises NetError (command + stderr) on failure."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise NetError(f"{' '.join(cmd)}: timed out after {timeout} s")
    if check and proc.returncode != 0:
        raise NetError(f"{' '.join(cmd)}: exit status {proc.returncode}: {proc.stderr.strip()}")
    return proc


def list_namespaces():
    out = sh(["ip", "netns", "list"]).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def namespace_pids(ns):
    proc = sh(["ip", "netns", "pids", ns], check=False)
    return [int(p) for p in proc.stdout.split() if p.isdigit()]


def _kill_namespace(ns):
    for pid in namespace_pids(ns):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    sh(["ip", "netns", "delete", ns], check=False)


def remove_stale():
    """Deletes this scheme's namespaces whose creating process is gone; returns their names."""
    removed = []
    for ns in list_namespaces():
        m = _STALE.match(ns)
        if not m:
            continue
        try:
            os.kill(int(m.group(1)), 0)
            continue  # its creator still runs
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        _kill_namespace(ns)
        removed.append(ns)
    return removed


class Hosts:
    def __init__(self, n):
        pid = os.getpid()
        self.n = n
        self.ns = [f"{PREFIX}{pid}-h{i}" for i in range(n)]
        self.bridge_ns = f"{PREFIX}{pid}-br"
        self.ifaces = [f"ks{pid}h{i}" for i in range(n)]  # <= 2 + 7 + 1 + 2 characters
        self.ports = [f"ks{pid}p{i}" for i in range(n)]
        self.bridge = f"ks{pid}br"
        self.subnet = f"10.214.{1 + pid % 250}"
        self.addrs = [f"{self.subnet}.{i + 1}" for i in range(n)]
        self.created = []  # namespaces to delete
        self.rate_mbit = None

    # --- set-up and tear-down ---------------------------------------------------------------

    def up(self):
        assert 1 <= self.n <= 99, "1..99 hosts (interface names stay within 15 characters)"
        for ns in [self.bridge_ns] + self.ns:
            sh(["ip", "netns", "add", ns])
            self.created.append(ns)
            sh(["ip", "-n", ns, "link", "set", "lo", "up"])
            # No IPv6 (router solicitations, DAD) on the links: only our traffic on the counters.
            for key in ("all", "default"):
                sh(["ip", "netns", "exec", ns, "sysctl", "-qw",
                    f"net.ipv6.conf.{key}.disable_ipv6=1"], check=False)
        br = ["ip", "-n", self.bridge_ns]
        sh(br + ["link", "add", self.bridge, "type", "bridge"])
        sh(br + ["link", "set", self.bridge, "up"])
        for i in range(self.n):
            # Created inside the bridge's namespace, the peer end goes straight to the host's.
            sh(br + ["link", "add", self.ports[i], "type", "veth", "peer", "name",
                     self.ifaces[i], "netns", self.ns[i]])
            sh(br + ["link", "set", self.ports[i], "master", self.bridge])
            sh(br + ["link", "set", self.ports[i], "up"])
            h = ["ip", "-n", self.ns[i]]
            sh(h + ["addr", "add", f"{self.addrs[i]}/24", "dev", self.ifaces[i]])
            sh(h + ["link", "set", self.ifaces[i], "up"])
        return self

    def kill_all(self):
        """SIGKILL to every process inside the hosts' namespaces (all of them are ours)."""
        killed = 0
        for ns in self.created:
            for pid in namespace_pids(ns):
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
                except ProcessLookupError:
                    pass
        return killed

    def pids(self):
        return [p for ns in self.created for p in namespace_pids(ns)]

    def down(self):
        errors = []
        self.kill_all()
        for ns in reversed(self.created):
            proc = sh(["ip", "netns", "delete", ns], check=False)
            if proc.returncode != 0 and ns in list_namespaces():
                errors.append(f"ip netns delete {ns}: {proc.stderr.strip()}")
        self.created = []
        return errors

    def __enter__(self):
        return self.up()

    def __exit__(self, *exc):
        self.down()
        return False

    # --- shaping ----------------------------------------------------------------------------

    def shape(self, rate_mbit, burst="32kb", latency="100ms"):
        """tbf on every host's egress at rate_mbit Mbit/s; None removes the shaper."""
        for ns, dev in zip(self.ns, self.ifaces):
            tc = ["ip", "netns", "exec", ns, "tc", "qdisc"]
            if rate_mbit is None:
                sh(tc + ["del", "dev", dev, "root"], check=False)  # none there is fine
            else:
                sh(tc + ["replace", "dev", dev, "root", "tbf", "rate", f"{rate_mbit}mbit",
                         "burst", burst, "latency", latency])
        self.rate_mbit = rate_mbit

    def qdisc_show(self, i):
        return sh(["ip", "netns", "exec", self.ns[i], "tc", "qdisc", "show", "dev",
                   self.ifaces[i]]).stdout.strip()

    # --- counters ---------------------------------------------------------------------------

    def tx_counters(self):
        """(bytes, packets) transmit counters of every host's veth. Bytes include the TCP/IP
        and Ethernet headers; a packet is one sk_buff (a GSO super-packet of up to 64 KiB
        counts once, with one set of headers, unless a qdisc such as tbf splits it)."""
        out = []
        for ns, dev in zip(self.ns, self.ifaces):
            info = json.loads(sh(["ip", "-n", ns, "-j", "-s", "link", "show", "dev", dev]).stdout)
            tx = info[0]["stats64"]["tx"]
            out.append((int(tx["bytes"]), int(tx["packets"])))
        return out

    def tx_bytes(self):
        """Transmit byte counter of every host's veth (includes TCP/IP and Ethernet headers)."""
        return [b for b, _ in self.tx_counters()]

    def qdisc_stats(self):
        """Per host: the root qdisc's kind, bytes, packets, drops, overlimits (cumulative)."""
        out = []
        for ns, dev in zip(self.ns, self.ifaces):
            info = json.loads(sh(["ip", "netns", "exec", ns, "tc", "-s", "-j", "qdisc", "show",
                                  "dev", dev]).stdout or "[]")
            root = next((q for q in info if q.get("root")), info[0] if info else {})
            out.append({k: root.get(k) for k in
                        ("kind", "bytes", "packets", "drops", "overlimits", "requeues")})
        return out

