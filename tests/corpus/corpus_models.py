"""The real-model corpus: public models that nobody on this project wrote.

Each class follows its public source; what changed for nanscope-train is listed
beside it. nanscope-train calls forward(inputs, targets) and wants a scalar
loss, so each model's training-loop loss is folded into forward (the only
change every model shares). Sizes are small so the corpus runs in CTest.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


# --- 1. nanoGPT (github.com/karpathy/nanoGPT, model.py) ----------------------
# ModuleDict `transformer` holding a ModuleList `h`, token embedding tied to
# lm_head, the non-flash attention path. Changed: a key-padding mask (pad id 0)
# beside the causal one, as batched fine-tuning code adds to it; targets of
# pads are -1, which nanoGPT's cross_entropy(ignore_index=-1) already skips.
class GPTConfig:
    def __init__(self, block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=32, dropout=0.0, bias=True):
        self.block_size, self.vocab_size, self.n_layer = block_size, vocab_size, n_layer
        self.n_head, self.n_embd, self.dropout, self.bias = n_head, n_embd, dropout, bias


class LayerNorm(nn.Module):
    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, input):
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.register_buffer("bias", torch.tril(torch.ones(config.block_size, config.block_size))
                             .view(1, 1, config.block_size, config.block_size))

    def causal_scores(self, x):
        """nanoGPT's attention up to its softmax: the masked scores, and v."""
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        return att.masked_fill(self.bias[:, :, :T, :T] == 0, float('-inf')), v

    def forward(self, x, key_padding):
        B, T, C = x.size()
        att, v = self.causal_scores(x)
        att = att.masked_fill(key_padding[:, None, None, :], float('-inf'))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, key_padding):
        x = x + self.attn(self.ln_1(x), key_padding)
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith('c_proj.weight'):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        key_padding = idx == 0
        tok_emb = self.transformer.wte(idx)
        pos_emb = self.transformer.wpe(pos)
        x = self.transformer.drop(tok_emb + pos_emb)
        for block in self.transformer.h:
            x = block(x, key_padding)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


# --- 2. VAE (github.com/pytorch/examples, vae/main.py) ------------------------
# Samples with randn_like. Changed: loss_function folded into forward, with the
# Gaussian (squared-error) reconstruction term that VAEs on unbounded data use
# in place of binary cross-entropy (LibTorch 2.x refuses BCE targets outside
# [0, 1], and the hazard here is such a row).
class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 400)
        self.fc21 = nn.Linear(400, 20)
        self.fc22 = nn.Linear(400, 20)
        self.fc3 = nn.Linear(20, 400)
        self.fc4 = nn.Linear(400, 784)

    def encode(self, x):
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu, logvar):
        std = torch.exp(0.5 * logvar)
        eps = torch.randn_like(std)
        return mu + eps * std

    def decode(self, z):
        h3 = F.relu(self.fc3(z))
        return torch.sigmoid(self.fc4(h3))

    def forward(self, inputs, targets):
        mu, logvar = self.encode(inputs.view(-1, 784))
        z = self.reparameterize(mu, logvar)
        recon_x = self.decode(z)
        MSE = F.mse_loss(recon_x, inputs.view(-1, 784), reduction='sum')
        KLD = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
        return (MSE + KLD) / inputs.size(0)


# --- 3. MNIST CNN (github.com/pytorch/examples, mnist/main.py) ----------------
# Dropout draws random numbers. Changed: nll_loss folded into forward.
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, inputs, targets):
        x = self.conv1(inputs)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.relu(x)
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.dropout2(x)
        x = self.fc2(x)
        output = F.log_softmax(x, dim=1)
        return F.nll_loss(output, targets)


# --- 4. LSTM classifier: the encoder of pytorch/examples' word_language_model
# (model.py RNNModel: Embedding, nn.LSTM, Dropout) with the masked mean over
# the non-pad outputs that sentence classifiers put on top, and a Linear head.
class LSTMClassifier(nn.Module):
    def __init__(self, ntoken=64, ninp=32, nhid=32, nlayers=2, nclass=4, dropout=0.0):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp, padding_idx=0)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout, batch_first=True)
        self.decoder = nn.Linear(nhid, nclass)
        initrange = 0.1
        nn.init.uniform_(self.encoder.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(self, inputs, targets):
        emb = self.drop(self.encoder(inputs))
        output, _ = self.rnn(emb)
        mask = (inputs != 0).unsqueeze(-1).to(output.dtype)
        pooled = (output * mask).sum(1) / mask.sum(1)  # mean over the tokens that are there
        return F.cross_entropy(self.decoder(self.drop(pooled)), targets)


# --- 5. A tabular MLP whose log-loss is a TorchScript function, written out as
# from-scratch logistic-regression tutorials write it: sigmoid, then
# -(y log p + (1 - y) log(1 - p)).
@torch.jit.script
def log_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    p = torch.sigmoid(logits)
    return -(y * torch.log(p) + (1 - y) * torch.log(1 - p)).mean()


class TabularMLP(nn.Module):
    def __init__(self, n_features=12, hidden=32):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(n_features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, 1)

    def forward(self, inputs, targets):
        return log_loss(self.head(self.body(inputs)).squeeze(-1), targets)


# --- 6. FT-Transformer (github.com/yandex-research/rtdl, rtdl/modules.py) ----
# Numerical feature tokenizer, [CLS] token, blocks that are ModuleDicts
# (attention, ffn, their normalizations) in a ModuleList, prenormalization.
# Changed: ReGLU replaced by ReLU, no dropout, and the first block's missing
# attention normalization is an nn.Identity (TorchScript cannot test a
# ModuleDict for a key).
class NumericalFeatureTokenizer(nn.Module):
    def __init__(self, n_features, d_token):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_features, d_token))
        self.bias = nn.Parameter(torch.empty(n_features, d_token))
        s = 1 / math.sqrt(d_token)
        nn.init.uniform_(self.weight, -s, s)
        nn.init.uniform_(self.bias, -s, s)

    def forward(self, x):
        return self.weight[None] * x[..., None] + self.bias[None]


class CLSToken(nn.Module):
    def __init__(self, d_token):
        super().__init__()
        s = 1 / math.sqrt(d_token)
        self.weight = nn.Parameter(torch.empty(d_token).uniform_(-s, s))

    def forward(self, x):
        return torch.cat([x, self.weight.view(1, 1, -1).expand(x.size(0), 1, -1)], dim=1)


class Attention(nn.Module):
    def __init__(self, d_token, n_heads):
        super().__init__()
        self.W_q = nn.Linear(d_token, d_token)
        self.W_k = nn.Linear(d_token, d_token)
        self.W_v = nn.Linear(d_token, d_token)
        self.W_out = nn.Linear(d_token, d_token)
        self.n_heads = n_heads

    def _reshape(self, x):
        b, n, d = x.shape
        return x.reshape(b, n, self.n_heads, d // self.n_heads).transpose(1, 2).reshape(b * self.n_heads, n, d // self.n_heads)

    def forward(self, x_q, x_kv):
        q, k, v = self._reshape(self.W_q(x_q)), self._reshape(self.W_k(x_kv)), self._reshape(self.W_v(x_kv))
        attention = F.softmax(q @ k.transpose(1, 2) / math.sqrt(k.shape[-1]), dim=-1)
        x = attention @ v
        b = x_q.shape[0]
        x = x.reshape(b, self.n_heads, x_q.shape[1], -1).transpose(1, 2).reshape(b, x_q.shape[1], -1)
        return self.W_out(x)


class FTTransformer(nn.Module):
    def __init__(self, n_features=8, d_token=32, n_blocks=2, n_heads=4, n_classes=3):
        super().__init__()
        self.tokenizer = NumericalFeatureTokenizer(n_features, d_token)
        self.cls_token = CLSToken(d_token)
        self.blocks = nn.ModuleList()
        for i in range(n_blocks):
            layer = nn.ModuleDict({
                'attention': Attention(d_token, n_heads),
                'ffn': nn.Sequential(nn.Linear(d_token, 2 * d_token), nn.ReLU(), nn.Linear(2 * d_token, d_token)),
                'ffn_normalization': nn.LayerNorm(d_token),
            })
            # rtdl: the first block's attention gets no prenormalization
            layer['attention_normalization'] = nn.LayerNorm(d_token) if i else nn.Identity()
            self.blocks.append(layer)
        self.head = nn.Sequential(nn.LayerNorm(d_token), nn.ReLU(), nn.Linear(d_token, n_classes))

    def forward(self, inputs, targets):
        x = self.cls_token(self.tokenizer(inputs))
        for layer in self.blocks:
            x_residual = layer['attention_normalization'](x)
            x = x + layer['attention'](x_residual, x_residual)
            x = x + layer['ffn'](layer['ffn_normalization'](x))
        return F.cross_entropy(self.head(x[:, -1]), targets)


# --- 7. nanoGPT with a hand-written softmax, traced and wrapped ---------------
# karpathy/nanoGPT's model.py as published (non-flash attention path, returns
# (logits, loss), token embedding tied to lm_head), with the one edit users
# make when they inline the softmax: exp(att) / exp(att).sum(-1) after
# nanoGPT's own masked_fill(bias == 0, -inf). Exported the way such a model
# reaches nanscope: torch.jit.trace of the GPT, inside a scripted module whose
# forward(inputs, targets) returns the loss. The block's input waits on the
# interpreter's stack below exp's argument there, which once hid exp's birth.
class ExpSumAttention(CausalSelfAttention):
    def forward(self, x):
        B, T, C = x.size()
        att, v = self.causal_scores(x)
        att = torch.exp(att) / torch.exp(att).sum(-1, keepdim=True)  # the user's softmax
        y = self.attn_dropout(att) @ v
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))


class ExpSumBlock(Block):
    def __init__(self, config):
        super().__init__(config)
        self.attn = ExpSumAttention(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class ExpSumGPT(GPT):
    """nanoGPT's GPT with ExpSumBlocks and its own (logits, loss) return."""

    def __init__(self, config):
        super().__init__(config)
        self.transformer.h = nn.ModuleList([ExpSumBlock(config) for _ in range(config.n_layer)])
        self.transformer.h.apply(self._init_weights)
        for pn, p in self.transformer.h.named_parameters():
            if pn.endswith('c_proj.weight'):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def forward(self, idx, targets):
        pos = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss


class LossOf(nn.Module):
    """The nanscope contract around a model that returns (logits, loss)."""

    def __init__(self, model):
        super().__init__()
        self.gpt = model

    def forward(self, inputs, targets):
        return self.gpt(inputs, targets)[1]


RARE_TOKEN = 63


def pretrained_with_a_sharp_rare_token(model, token=RARE_TOKEN, gain=5.0):
    """The state a fine-tune starts from: pre-training left one rare token (an
    unused special token) with a large embedding, and block 0's first head
    attending sharply along it. Every other token and position is orthogonal to
    that direction, so only a sequence holding the rare token sends that head's
    logits (~8 gain^2 = 200) past exp's range (88.7, in fp32 and bf16 alike):
    the step is decided by the data."""
    gpt = model.gpt
    with torch.no_grad():
        wte, wpe = gpt.transformer.wte.weight, gpt.transformer.wpe.weight
        C = wte.shape[1]
        d = torch.randn(C, generator=torch.Generator().manual_seed(7))
        d -= d.mean()  # orthogonal to the ones vector: LayerNorm's centring leaves it alone
        d /= d.norm()
        others = [i for i in range(wte.shape[0]) if i != token]
        wte[others] -= torch.outer(wte[others] @ d, d)
        wpe -= torch.outer(wpe @ d, d)
        wte[token] = d * 50 * wte[others].norm(dim=1).mean()
        attn = gpt.transformer.h[0].attn.c_attn.weight  # rows: q, then k, then v
        attn[0] += gain * d       # query coordinate 0 of head 0
        attn[C] += gain * d       # key coordinate 0 of head 0
    return model
