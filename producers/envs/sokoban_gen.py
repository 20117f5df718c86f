"""Sokoban room generation with ROLL's algorithm, so that a ROLL tag gets ROLL's rooms.

The algorithm is the one of ROLL's `roll/pipeline/agentic/env/sokoban/utils.py` (alibaba/ROLL
at 8eb27cc2, itself adapted from gym-sokoban 0.0.6), described and written here:

1. Topology: a random walk of `int(1.7 * (rows + cols))` steps starts at a random cell
   (row in 1..rows-1, col in 1..cols-1) with a random heading. Each step turns to a random
   heading with probability 0.35, moves one cell (kept inside the border), and marks as
   floor one of five small shapes around the new cell, picked at random. The border is wall.
2. Placement: the player on a random floor cell, then each target on a random floor cell not
   yet taken. Fewer than `num_boxes + 2` floor cells fail the attempt.
3. Reverse play: from the solved state (every box on its target) a depth-first search over
   reverse moves (up, down, left, right: the player steps to a free cell, pulling the box
   behind it along, if there is one) to `search_depth - 2` moves deep, visiting each
   layout once (the first path to it wins) and at most 300,000 layouts. A layout scores
   `box switches * displacement` (the number of times the pulled box changed along the
   path, times the summed Manhattan distance of the boxes from their own targets), and 0
   unless every target is uncovered (no box and not the player on it). The first layout with
   the best score is the room; when nothing beat 0, the attempt fails.
4. Player drift: with probability 0.8 when the displacement is 1, else 0.5, the player then
   walks 1 to 3 random steps onto free cells it has not stood on (each further step with
   probability 0.5), so that it does not always start next to a box.

A failed attempt is followed by a new one (ROLL reseeds its reset and starts over, which
draws from the same distribution). Everything random comes from the `np.random.Generator`
passed in (the env's own), so a room is a function of the reset seed, and generation is safe
in many threads at once. The same seed does not give ROLL's room (ROLL draws from Python's
`random` and numpy's global state); the rooms follow the same distribution.

Cells are flat indices `row * cols + col`; the border is always wall, so a step from a floor
cell never leaves the grid.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

WALK_STEPS_PER_SIDE = 1.7  # the walk takes int(1.7 * (rows + cols)) steps
TURN_PROBABILITY = 0.35  # chance the walk picks a new heading before a step
# (d_row, d_col) headings of the walk, and the shapes it marks as floor around its cell
WALK_HEADINGS = ((1, 0), (0, 1), (-1, 0), (0, -1))
FLOOR_SHAPES = (
    ((0, -1), (0, 0), (0, 1)),  # a row of three
    ((-1, 0), (0, 0), (1, 0)),  # a column of three
    ((0, -1), (0, 0), (1, 0)),  # the cell, its left and the one below
    ((0, -1), (0, 0), (1, -1), (1, 0)),  # a 2x2 block, left and below
    ((0, 0), (0, 1), (1, 0)),  # the cell, its right and the one below
)
MAX_LAYOUTS = 300_000  # the reverse search visits at most this many layouts
DRIFT_IF_ONE_AWAY = 0.8  # chance the player drifts when the boxes are 1 cell from targets
DRIFT = 0.5  # ... otherwise
DRIFT_GO_ON = 0.5  # chance of each further drift step
DRIFT_MAX_STEPS = 3
MAX_ATTEMPTS = 1_000  # attempts before giving up (a sane room succeeds within a few)


@dataclass(frozen=True)
class Room:
    """A generated room: the floor, the targets, and the start positions (flat cells)."""

    rows: int
    cols: int
    floor: tuple[bool, ...]  # True for floor (targets included), False for wall
    targets: tuple[int, ...]
    boxes: tuple[int, ...]
    player: int
    displacement: int  # summed distance of the boxes from their own targets


def generate_room(
    dim_room: tuple[int, int], num_boxes: int, search_depth: int, rng: np.random.Generator
) -> Room:
    """A solvable room drawn with `rng`, every target uncovered (see the module docstring).

    `RuntimeError` after `MAX_ATTEMPTS` failed attempts (a room too cramped for its boxes,
    or a `search_depth` too small to pull a box off its target)."""
    rows, cols = dim_room
    for _ in range(MAX_ATTEMPTS):
        room = _attempt(rows, cols, num_boxes, search_depth, rng)
        if room is not None:
            return room
    raise RuntimeError(
        f"no Sokoban room after {MAX_ATTEMPTS} attempts (dim_room={dim_room}, "
        f"num_boxes={num_boxes}, search_depth={search_depth})"
    )


def _attempt(
    rows: int, cols: int, num_boxes: int, search_depth: int, rng: np.random.Generator
) -> Room | None:
    """One attempt: walk, place, reverse play, drift; None when it fails."""
    floor = walk_floor(rows, cols, rng)
    cells = [cell for cell, is_floor in enumerate(floor) if is_floor]
    if len(cells) < num_boxes + 2:
        return None
    picks = rng.choice(len(cells), size=num_boxes + 1, replace=False).tolist()
    player = cells[picks[0]]
    targets = tuple(cells[i] for i in picks[1:])
    found = reverse_play(floor, cols, targets, player, search_depth)
    if found is None:
        return None
    boxes, player, displacement = found
    player = drift(floor, cols, set(boxes), player, displacement, rng)
    return Room(rows, cols, tuple(floor), tuple(sorted(targets)), tuple(sorted(boxes)),
                player, displacement)


def walk_floor(rows: int, cols: int, rng: np.random.Generator) -> list[bool]:
    """The floor a random walk marks (step 1 of the module docstring); True = floor."""
    steps = int(WALK_STEPS_PER_SIDE * (rows + cols))
    row = int(rng.integers(1, rows))  # 1..rows-1: the first step brings it inside
    col = int(rng.integers(1, cols))
    heading = WALK_HEADINGS[int(rng.integers(len(WALK_HEADINGS)))]
    turns = rng.random(steps).tolist()
    headings = rng.integers(len(WALK_HEADINGS), size=steps).tolist()
    shapes = rng.integers(len(FLOOR_SHAPES), size=steps).tolist()
    floor = [False] * (rows * cols)
    for step in range(steps):
        if turns[step] < TURN_PROBABILITY:
            heading = WALK_HEADINGS[headings[step]]
        row = min(max(row + heading[0], 1), rows - 2)
        col = min(max(col + heading[1], 1), cols - 2)
        for d_row, d_col in FLOOR_SHAPES[shapes[step]]:
            floor[(row + d_row) * cols + col + d_col] = True
    for row in range(rows):  # the border is wall
        floor[row * cols] = floor[row * cols + cols - 1] = False
    for col in range(cols):
        floor[col] = floor[(rows - 1) * cols + col] = False
    return floor


def reverse_play(
    floor: list[bool], cols: int, targets: tuple[int, ...], player: int, search_depth: int
) -> tuple[tuple[int, ...], int, int] | None:
    """(boxes, player, displacement) of the best layout reverse play reaches from the solved
    state (step 3 of the module docstring), or None when no layout scores above 0.

    Depth-first, in the order a recursive search takes: a node is scored and marked when it
    is first reached with depth budget left, and its children are visited in action order
    before its next sibling. `boxes[i]` is where the box of `targets[i]` stands.

    A layout is told apart as ROLL's search tells it apart: by the player, the boxes, and
    which boxes have been pulled at least once (not by which box is which). Its key is one
    int, the sorted `2 * cell + pulled` of the boxes in base `2 * size`, times `size`, plus
    the player's cell; the displacement and the number of covered targets change only with a
    pull, so a frame carries them.
    """
    size = len(floor)
    deltas = (-cols, cols, -1, 1)
    target_set = frozenset(targets)
    # distance[i][cell]: Manhattan distance from `cell` to box i's own target
    distance = []
    for target in targets:
        t_row, t_col = divmod(target, cols)
        distance.append([abs(row - t_row) + abs(col - t_col)
                         for row, col in (divmod(cell, cols) for cell in range(size))])
    base = 2 * size

    def box_code(boxes: tuple[int, ...], moved: int) -> int:
        code = 0
        for value in sorted(box * 2 + (moved >> i & 1) for i, box in enumerate(boxes)):
            code = code * base + value
        return code

    explored: set[int] = set()
    best_score = 0  # the solved start scores 0; only a better layout replaces it
    best: tuple[tuple[int, ...], int, int] | None = None
    limit = MAX_LAYOUTS
    root_ttl = search_depth - 1
    if root_ttl <= 0:
        return None
    explored.add(box_code(targets, 0) * size + player)
    # a frame: player, boxes, moved (bit i: box i was pulled), box code, swaps, last pulled
    # box, displacement, boxes on targets, ttl, next action
    stack: list[list[Any]] = [[player, tuple(targets), 0, box_code(targets, 0), 0, -1, 0,
                               len(targets), root_ttl, 0]]
    while stack:
        frame = stack[-1]
        action = frame[9]
        if action == 4:
            stack.pop()
            continue
        frame[9] = action + 1
        here, boxes, moved, code, swaps, last, displacement, covered, ttl = frame[:9]
        ttl -= 1
        if ttl <= 0 or len(explored) >= limit:
            continue  # ROLL's recursion returns at once for every child
        delta = deltas[action]
        to = here + delta
        if not floor[to] or to in boxes:
            continue  # blocked: the same layout, already explored
        behind = here - delta
        if behind in boxes:  # the pull: the box behind comes to the player's cell
            pulled = boxes.index(behind)
            boxes = boxes[:pulled] + (here,) + boxes[pulled + 1:]
            moved |= 1 << pulled
            code = box_code(boxes, moved)
            if pulled != last:
                swaps += 1
                last = pulled
            far = distance[pulled]
            displacement += far[here] - far[behind]
            covered += (here in target_set) - (behind in target_set)
        key = code * size + to
        if key in explored:
            continue
        explored.add(key)
        if not covered and to not in target_set and swaps * displacement > best_score:
            best_score, best = swaps * displacement, (boxes, to, displacement)
        stack.append([to, boxes, moved, code, swaps, last, displacement, covered, ttl, 0])
    return best


def drift(
    floor: list[bool], cols: int, boxes: set[int], player: int, displacement: int,
    rng: np.random.Generator,
) -> int:
    """Where the player stands after its random drift (step 4 of the module docstring)."""
    chance = DRIFT_IF_ONE_AWAY if displacement == 1 else DRIFT
    if rng.random() > chance:
        return player
    visited = [player]
    for step in range(1, DRIFT_MAX_STEPS + 1):
        options = [player + delta for delta in (-cols, cols, -1, 1)]
        options = [cell for cell in options
                   if floor[cell] and cell not in boxes and cell not in visited]
        if not options:
            break
        player = options[int(rng.integers(len(options)))]
        visited.append(player)
        if step >= DRIFT_MAX_STEPS or rng.random() > DRIFT_GO_ON:
            break
    return player
