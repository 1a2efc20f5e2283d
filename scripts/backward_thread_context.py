# One-off check: where does attnlab.attention's backward get "invalid argument" from? Peeks at the runtime's last error on the main and the autograd thread; run with CUDA_LOG_FILE=stdout and under compute-sanitizer.
import ctypes, sys, os, torch, attnlab
def cudart():
    for line in open("/proc/self/maps"):
        if "libcudart.so" in line:
            return ctypes.CDLL(line.split()[-1])
rt = cudart()
print("libcudart loaded:", [l.split()[-1] for l in open("/proc/self/maps") if "libcudart" in l][:3])
peek = rt.cudaPeekAtLastError
N = int(sys.argv[1]) if len(sys.argv) > 1 else 129
mode = sys.argv[2] if len(sys.argv) > 2 else "randn"
torch.manual_seed(0)
q = torch.randn(1, 4, N, 64, device="cuda", dtype=torch.float16, requires_grad=True)
k = torch.randn_like(q).requires_grad_(); v = torch.randn_like(q).requires_grad_()
print("after inputs: peek", peek())
o = attnlab.attention(q, k, v, is_causal=True)
print("after forward: peek", peek())
import threading
o.register_hook(lambda g: print("hook in thread", threading.get_ident() != threading.main_thread().ident, "peek", peek(), "grad contiguous", g.is_contiguous(), g.data_ptr() % 512))
g = torch.randn_like(o) if mode == "randn" else torch.ones((), device="cuda", dtype=o.dtype).expand(o.shape)
print("after grad (", mode, "): peek", peek(), "ptr%16", g.data_ptr() % 16)
torch.cuda.synchronize(); print("after sync: peek", peek())
try:
    torch.autograd.grad(o, (q, k, v), g)
    print("N", N, mode, "PASS")
except RuntimeError as e:
    print("N", N, mode, "FAIL:", e)
# directly, in this thread:
print("direct before: peek", peek())
try:
    attnlab.backward(q.detach(), k.detach(), v.detach(), o.detach(), attnlab.forward(q.detach(), k.detach(), v.detach(), is_causal=True)[1], torch.randn_like(o), is_causal=True)
    print("direct PASS")
except RuntimeError as e:
    print("direct FAIL:", e)
