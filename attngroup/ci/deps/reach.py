"""Transitive reachability of every node at once, as bitsets over strongly connected components.

Hundreds of steps each ask "which files does importing these roots execute?". A breadth-first
search per step repeats the same work over one large import graph (vLLM's package is mostly
one import cycle), so the closure of every component is computed once, sinks first, as a
Python int whose bit ``i`` stands for node ``i``; a step's closure is the OR of its roots'.
"""

from __future__ import annotations

from collections.abc import Sequence


def closures(successors: Sequence[Sequence[int]]) -> list[int]:
    """For each node, the bitset of the nodes reachable from it (itself included)."""
    count = len(successors)
    index = [-1] * count
    low = [0] * count
    on_stack = [False] * count
    component_of = [-1] * count
    component_bits: list[int] = []
    stack: list[int] = []
    counter = 0
    for start in range(count):
        if index[start] != -1:
            continue
        work = [(start, 0)]
        while work:
            node, position = work.pop()
            if position == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack[node] = True
            targets = successors[node]
            while position < len(targets):
                target = targets[position]
                position += 1
                if index[target] == -1:
                    work.append((node, position))
                    work.append((target, 0))
                    break
                if on_stack[target]:
                    low[node] = min(low[node], index[target])
            else:
                if low[node] == index[node]:
                    # Tarjan emits components sinks first: successors' closures are ready.
                    members = []
                    while True:
                        member = stack.pop()
                        on_stack[member] = False
                        component_of[member] = len(component_bits)
                        members.append(member)
                        if member == node:
                            break
                    bits = 0
                    for member in members:
                        bits |= 1 << member
                    for member in members:
                        for target in successors[member]:
                            done = component_of[target]
                            if done != -1 and done != component_of[node]:
                                bits |= component_bits[done]
                    component_bits.append(bits)
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
    return [component_bits[component_of[node]] for node in range(count)]


def members(bits: int) -> list[int]:
    """Indices of the set bits, ascending."""
    text = bin(bits)[:1:-1]  # least significant bit first
    found = []
    index = text.find("1")
    while index != -1:
        found.append(index)
        index = text.find("1", index + 1)
    return found
