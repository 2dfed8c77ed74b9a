"""The benchmark's view of processes, read from ``/proc`` (Linux; no
dependency): who is under whom, their CPU time, and ending a tree that the
benchmark started, by PID.
"""
import os
import signal

__all__ = ["stat_fields", "process_table", "descendants", "tree_cpu_s", "tree_snapshot",
           "kill_survivors"]

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
