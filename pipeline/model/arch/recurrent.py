"""What every recurrent mixer shares (Mamba-1 and -2, Gated DeltaNet, Kimi Delta Attention,
lightning attention, short convolutions): a scan along the row that carries a state.

`scan` runs over rows of one sequence each, from the state in the dict it is given (None or
empty: zeros) and leaves its end state there. Over packed rows (a choice task's sequences in one
row: tables.layout) each sequence's shared tokens are scanned once from zeros and each of its
branches from the state they leave, as llama.cpp copies a sequence's state into each of its
branches; padding is a sequence of its own.
"""
import torch

from .blocks import Weights


class RecurrentMixer(Weights):
    def forward(self, x: torch.Tensor, tables=None, state: dict | None = None) -> torch.Tensor:
        # x [B, T, hidden] -> [B, T, hidden]
        layout = None if tables is None else tables.layout
        if layout is None:
            return self.scan(x, tables, state)
        return torch.cat([self.forked(x[r:r + 1], layout[r]) for r in range(x.shape[0])])

    def scan(self, x: torch.Tensor, tables=None, state: dict | None = None) -> torch.Tensor:
        raise NotImplementedError

    def forked(self, x: torch.Tensor, layout: torch.Tensor) -> torch.Tensor:
        """One packed row x [1, T, hidden], its layout [T, LAYOUT_FIELDS] -> [1, T, hidden]: each
        run of one sequence's shared tokens scanned from zeros, each run of one of its branches
        from the state the shared tokens leave."""
        _, sequence, branch = layout.T.tolist()
        out, start, shared = [], 0, {}
        for end in range(1, len(sequence) + 1):
            if end < len(sequence) and (sequence[end], branch[end]) == (sequence[start], branch[start]):
                continue
            if start == 0 or sequence[start] != sequence[start - 1]:
                shared = {}                          # a sequence begins: from zeros
            # its shared tokens leave their state in `shared`; each branch starts from a copy of it
            out.append(self.scan(x[:, start:end], None, shared if branch[start] == 0 else dict(shared)))
            start = end
        return torch.cat(out, dim=1)
