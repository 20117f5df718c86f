"""Sokoban room generation: a random-walk floor, then reverse play from the solved state.

A room starts solved (every box on its target) and boxes are *pulled* off their targets by
reverse moves of the player. Every reverse move has a forward move that undoes it, so the
room that comes out is solvable by construction: play the reverse moves backwards.

Everything random comes from the `np.random.Generator` passed in (the env's own), so a room
is a function of the reset seed, and generation is safe to run in many threads at once.

Cells are flat indices `row * cols + col`. The room's border is always wall, so a step from a
floor cell never leaves the grid and needs no bounds check.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FLOOR_FRACTION = 0.6  # share of the interior the random walk carves
TURN_PROBABILITY = 0.35  # chance the walk picks a new direction at each step
WIDEN_PROBABILITY = 0.3  # chance a walk step also carves a cell beside it
MAX_SEARCH_STATES = 20_000  # bound on the reverse-play search, whatever search_depth says
GOOD_DISPLACEMENT = 2  # total distance of boxes from targets that ends the attempts early
MAX_ATTEMPTS = 100  # rooms tried before settling for the best one (or giving up)

_WALK_DIRECTIONS = ((-1, 0), (1, 0), (0, -1), (0, 1))


@dataclass(frozen=True)
class Room:
    """A generated room: the floor, the targets, and the start positions (flat cells)."""

    rows: int
    cols: int
    floor: tuple[bool, ...]
    targets: tuple[int, ...]
    boxes: tuple[int, ...]
    player: int
    score: tuple[int, int]  # (boxes off targets, their total distance to targets)


def generate_room(
    dim_room: tuple[int, int], num_boxes: int, search_depth: int, rng: np.random.Generator
) -> Room:
    """A solvable room drawn with `rng`.

    An attempt fails when the walk leaves too little floor or no box could be pulled off its
    target, and is weak when the boxes end less than `GOOD_DISPLACEMENT` cells from the
    targets (solved in one push, it teaches little). Attempts go on until one is good, then
    the best room found is kept (a cramped room may allow no better). Every attempt draws from
    the same generator, so retries are as reproducible as the first try.
    """
    rows, cols = dim_room
    best: Room | None = None
    for _ in range(MAX_ATTEMPTS):
        room = _try_room(rows, cols, num_boxes, search_depth, rng)
        if room is not None and (best is None or room.score > best.score):
            best = room
        if best is not None and best.score[1] >= GOOD_DISPLACEMENT:
            break
    if best is not None:
        return best
    raise RuntimeError(
        f"no solvable Sokoban room after {MAX_ATTEMPTS} attempts "
        f"(dim_room={dim_room}, num_boxes={num_boxes}, search_depth={search_depth})"
    )


def _try_room(
    rows: int, cols: int, num_boxes: int, search_depth: int, rng: np.random.Generator
) -> Room | None:
    """One attempt: carve, place targets and player, pull boxes; None when it fails."""
    floor = carve_floor(rows, cols, min_floor=num_boxes + 2, rng=rng)
    cells = [cell for cell, is_floor in enumerate(floor) if is_floor]
    if len(cells) < num_boxes + 2:
        return None
    chosen = rng.choice(len(cells), size=num_boxes + 1, replace=False).tolist()
    targets = tuple(sorted(cells[i] for i in chosen[:num_boxes]))
    player = cells[chosen[num_boxes]]
    found = reverse_play(floor, cols, targets, player, search_depth, rng)
    if found is None:
        return None
    boxes, start, score = found
    return Room(rows, cols, tuple(floor), targets, boxes, start, score)


def carve_floor(rows: int, cols: int, min_floor: int, rng: np.random.Generator) -> list[bool]:
    """Floor cells carved by a random walk inside the border; True = floor.

    The walk keeps a direction and turns now and then, sometimes carving a second cell beside
    its path so that the room has open areas where boxes can be moved, and stops once it has
    carved `FLOOR_FRACTION` of the interior (at least `min_floor` cells).
    """
    inner_rows, inner_cols = rows - 2, cols - 2
    inner = inner_rows * inner_cols
    wanted = min(inner, max(min_floor, round(FLOOR_FRACTION * inner)))
    max_walk = 8 * inner
    turns = rng.random(max_walk).tolist()
    headings = rng.integers(0, 4, size=max_walk).tolist()
    widens = rng.random(max_walk).tolist()
    row = int(rng.integers(1, rows - 1))
    col = int(rng.integers(1, cols - 1))
    heading = int(rng.integers(0, 4))
    floor = [False] * (rows * cols)
    floor[row * cols + col] = True
    carved = 1
    for step in range(max_walk):
        if carved >= wanted:
            break
        if turns[step] < TURN_PROBABILITY:
            heading = headings[step]
        d_row, d_col = _WALK_DIRECTIONS[heading]
        row = min(max(row + d_row, 1), rows - 2)
        col = min(max(col + d_col, 1), cols - 2)
        carved += _carve(floor, row * cols + col)
        if widens[step] < WIDEN_PROBABILITY:
            side_row = min(max(row + d_col, 1), rows - 2)  # perpendicular to the heading
            side_col = min(max(col + d_row, 1), cols - 2)
            carved += _carve(floor, side_row * cols + side_col)
    return floor


def _carve(floor: list[bool], cell: int) -> int:
    """Make `cell` floor; 1 if it was wall, else 0."""
    if floor[cell]:
        return 0
    floor[cell] = True
    return 1


def reverse_play(
    floor: list[bool],
    cols: int,
    targets: tuple[int, ...],
    player: int,
    search_depth: int,
    rng: np.random.Generator,
) -> tuple[tuple[int, ...], int, tuple[int, int]] | None:
    """Boxes and player after pulling boxes off `targets`: (boxes, player, score), or None.

    Breadth-first over reverse moves from the solved state, to `search_depth` moves and at most
    `MAX_SEARCH_STATES` states. A reverse move walks the player to a free neighbour cell; if a
    box stands on the other side of the player, it may come along (a pull). The kept state
    has the most boxes off targets, then the largest total distance of boxes from their
    nearest target (the score); ties are broken at random. None when no box left its target.
    """
    deltas = (-cols, cols, -1, 1)
    distance = _distance_to_targets(len(floor), cols, targets)
    start = (player, targets)
    seen = {start}
    frontier = [start]
    best_score = (0, 0)
    best: list[tuple[int, tuple[int, ...]]] = []
    for _ in range(search_depth):
        next_frontier = []
        for state in frontier:
            for new_state in _reverse_moves(state, floor, deltas):
                if new_state in seen:
                    continue
                seen.add(new_state)
                next_frontier.append(new_state)
                score = _score(new_state[1], distance)
                if score > best_score:
                    best_score, best = score, [new_state]
                elif score == best_score and best:
                    best.append(new_state)
        frontier = next_frontier
        if not frontier or len(seen) >= MAX_SEARCH_STATES:
            break
    if not best:
        return None
    start_player, boxes = best[int(rng.integers(len(best)))]
    return boxes, start_player, best_score


def _reverse_moves(
    state: tuple[int, tuple[int, ...]], floor: list[bool], deltas: tuple[int, ...]
) -> list[tuple[int, tuple[int, ...]]]:
    """States one reverse move away: each free step, plus the pull when a box is behind."""
    player, boxes = state
    moves = []
    for delta in deltas:
        to = player + delta
        if not floor[to] or to in boxes:
            continue
        moves.append((to, boxes))
        behind = player - delta
        if behind in boxes:
            pulled = tuple(sorted(player if box == behind else box for box in boxes))
            moves.append((to, pulled))
    return moves


def _score(boxes: tuple[int, ...], distance: list[int]) -> tuple[int, int]:
    """(boxes off targets, total distance of boxes to their nearest target): more is better."""
    off = 0
    total = 0
    for box in boxes:
        away = distance[box]
        total += away
        off += away > 0
    return off, total


def _distance_to_targets(size: int, cols: int, targets: tuple[int, ...]) -> list[int]:
    """Manhattan distance from every cell to its nearest target."""
    spots = [divmod(target, cols) for target in targets]
    return [
        min(abs(row - t_row) + abs(col - t_col) for t_row, t_col in spots)
        for row, col in (divmod(cell, cols) for cell in range(size))
    ]
