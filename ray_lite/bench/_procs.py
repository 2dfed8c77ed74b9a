"""The benchmark's view of processes, read from ``/proc`` (Linux; no
dependency): who is under whom, their CPU time, who holds a listening
socket, a CPU hog to run beside a load, and ending a tree that the
benchmark started, by PID.

Standalone (the standard library only): the workload scripts, which run
without ray_lite on Ray's Python, import it as a sibling file.
"""
import os
import signal
import subprocess
import sys
import time

__all__ = ["stat_fields", "process_table", "descendants", "tree_cpu_s", "tree_snapshot",
           "kill_survivors", "cpu_by_process", "command_of", "listening_inodes", "holds_socket",
           "start_hog", "stop_hog"]

_TICKS = os.sysconf("SC_CLK_TCK")


def stat_fields(pid):
    """The fields of ``/proc/<pid>/stat`` after ``pid (comm)`` (state first,
    then ppid, ...; utime and stime are [11] and [12]), or None if gone.
    The command name may hold spaces and parentheses: split after the last ')'."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rindex(b")") + 2:].split()


def process_table():
    """``{pid: (ppid, utime + stime in ticks, start time in ticks)}`` of every
    process now alive."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = stat_fields(name)
            if fields is not None:
                table[int(name)] = (int(fields[1]), int(fields[11]) + int(fields[12]),
                                    int(fields[19]))
    return table


def descendants(root, table=None):
    """``root`` and every live process under it."""
    table = process_table() if table is None else table
    children = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def tree_cpu_s(root):
    """User + system CPU seconds of ``root`` and every live descendant."""
    table = process_table()
    return sum(table[pid][1] for pid in descendants(root, table) if pid in table) / _TICKS


def tree_snapshot(root):
    """``{pid: start time}`` of ``root``'s tree, to end later by PID."""
    table = process_table()
    return {pid: table[pid][2] for pid in descendants(root, table) if pid in table}


def kill_survivors(snapshot):
    """SIGKILL every process of ``snapshot`` still alive as the same process
    (same PID and start time: a reused PID is someone else's)."""
    for pid, started in snapshot.items():
        fields = stat_fields(pid)
        if fields is not None and int(fields[19]) == started and fields[0] != b"Z":
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def command_of(pid, width=48):
    """What process ``pid`` runs, as a short text: its command line (the
    program's file name, then its arguments) cut to ``width``, else its name."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().decode(errors="replace").split("\0")
    except OSError:
        args = []
    args = [a for a in args if a]
    if len(args) > 2 and args[1] == "-c":       # the program's text says little: its arguments
        args = args[:2] + ["…"] + args[3:]
    if args:
        text = " ".join([os.path.basename(args[0])] + args[1:])
    else:
        try:
            with open(f"/proc/{pid}/comm") as f:
                text = f.read().strip()
        except OSError:
            text = "?"
    return text if len(text) <= width else text[: width - 1] + "…"


def cpu_by_process(sample_s):
    """``{pid: (name, CPU seconds)}``: what each process used over the next
    ``sample_s`` seconds (processes alive at both ends of the sample, as the
    same process: same start time)."""
    before = process_table()
    time.sleep(sample_s)
    after = process_table()
    used = {}
    for pid, (_, ticks, started) in after.items():
        old = before.get(pid)
        if old is not None and old[2] == started and ticks > old[1]:
            used[pid] = (command_of(pid), (ticks - old[1]) / _TICKS)
    return used


def listening_inodes(port):
    """The socket inodes listening on TCP ``port`` (IPv4 and IPv6)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    cols = line.split()
                    if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(cols[9])
        except OSError:
            pass
    return inodes


def holds_socket(pid, inodes):
    """Whether process ``pid`` has one of the sockets ``inodes`` open."""
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:[") and link[8:-1] in inodes:
                return True
    except OSError:
        pass
    return False


def start_hog():
    """One CPU-bound process at normal priority (ended by its PID with ``stop_hog``)."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)


def stop_hog(hog):
    if hog is not None and hog.poll() is None:
        os.kill(hog.pid, signal.SIGKILL)
        hog.wait(10)
