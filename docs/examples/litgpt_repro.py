"""The causes the trial of docs/your-library.md met on litgpt 0.5.13, through litgpt's own GPT (tiny random weights,
no download): each compares a cached forward's logits with a cache-free forward over the tokens the history should
hold (GPT.forward without input_pos applies the sliding window itself). A difference of the order of the logits is a
real defect; one at float32 rounding (about 1e-7) is served right by the data.

    python docs/examples/litgpt_repro.py
"""

import torch
from litgpt import GPT, Config

POSITIONS = 8   # the cache's max_seq_length


def model_with_window(window):
    torch.manual_seed(0)
    config = Config(n_layer=1, n_head=2, n_query_groups=2, n_embd=16, block_size=16, vocab_size=32,
                    padded_vocab_size=32, sliding_window_size=window, sliding_window_indices=[1], rotary_percentage=1.0)
    return GPT(config).eval()


@torch.no_grad()
def cached(model, chunks):
    """Forward (token ids, first position) chunks through a new KV cache, as generate and speculative decoding do;
    the last chunk's logits."""
    model.set_kv_cache(batch_size=1, max_seq_length=POSITIONS)
    for ids, start in chunks:
        logits = model(ids, input_pos=torch.arange(start, start + ids.shape[1]), input_pos_maxp1=start + ids.shape[1])
    return logits


@torch.no_grad()
def difference(model, chunks, history):
    """max |logits| difference between the chunks' last forward and a cache-free forward of `history`."""
    last = chunks[-1][0].shape[1]
    return float((cached(model, chunks) - model(history)[:, -last:]).abs().max())


TOKENS = torch.tensor([[3, 17, 9, 25, 4]])
OTHER = torch.tensor([[5]])


def control():
    """One token at a time past a window of 2: the harness agrees with itself."""
    model = model_with_window(2)
    return max(difference(model, [(TOKENS[:, i:i + 1], i) for i in range(n)], TOKENS[:, :n]) for n in range(1, 6))


def chunk_after_the_first_token():
    """A chunk of 2 tokens (no longer than the window of 2, as KVCache's own error message advises) at positions
    1 and 2: the ring overwrites position 0 before the queries read it, and the query at 1 attends position 2."""
    return difference(model_with_window(2), [(TOKENS[:, :1], 0), (TOKENS[:, 1:3], 1)], TOKENS[:, :3])


def rollback_after_the_ring_wrapped():
    """Three tokens one by one in a window of 2, two rejected (input_pos back to 1, as speculative decoding moves
    it), then another token at position 1: it attends the rejected token 2's row instead of position 0."""
    chunks = [(TOKENS[:, :1], 0), (TOKENS[:, 1:2], 1), (TOKENS[:, 2:3], 2), (OTHER, 1)]
    return difference(model_with_window(2), chunks, torch.cat([TOKENS[:, :1], OTHER], dim=1))


def rollback_of_one_in_a_full_ring():
    """Three tokens in one step in a window of 3, one rejected, another at position 2: every row it attends is
    still held, and it is served exactly (the suite's lenient OP-TRIM here is a false alarm)."""
    return difference(model_with_window(3), [(TOKENS[:, :3], 0), (OTHER, 2)], torch.cat([TOKENS[:, :2], OTHER], dim=1))


if __name__ == "__main__":
    for case in (control, chunk_after_the_first_token, rollback_after_the_ring_wrapped, rollback_of_one_in_a_full_ring):
        print(f"{case.__name__}: max |logit difference| {case():.2e}")
