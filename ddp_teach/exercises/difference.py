"""Where a learner's tensors first differ from the expected ones, in words a
hint can show: the smallest failing input deserves the exact values too
(which tensor, which element, expected and received)."""
import torch


def first_difference(got, want, names=None, atol: float = 1e-6,
                     rtol: float = 1e-5) -> str:
    """"param 0 (shape (8, 6)) at [2, 1]: expected 0.1234, got 0.2468" for
    the first of `want`'s tensors that `got` does not match (None, another
    shape, or a value off by more than atol + rtol * |expected|); "" when
    every tensor matches. names label the tensors (default: "tensor i")."""
    for index, expected in enumerate(want):
        name = names[index] if names else f"tensor {index}"
        received = got[index] if index < len(got) else None
        if not isinstance(received, torch.Tensor):
            return f"{name}: expected a tensor of shape {tuple(expected.shape)}, got {received!r:.60}"
        if received.shape != expected.shape:
            return (f"{name}: expected shape {tuple(expected.shape)}, got "
                    f"shape {tuple(received.shape)}")
        received, expected = received.double(), expected.double()
        off = ~torch.isclose(received, expected, rtol=rtol, atol=atol, equal_nan=True)
        if off.any():
            where = [int(i) for i in off.nonzero()[0]]
            at = f" at {where}" if where else ""
            return (f"{name} (shape {tuple(expected.shape)}){at}: expected "
                    f"{expected[tuple(where)].item():.6g}, got "
                    f"{received[tuple(where)].item():.6g}")
    return ""
