/* A vendor library built like OpenBLAS's and cuBLAS's kernels: its innermost function is
 * hand-written assembly with no unwind information (no .cfi directives, so .eh_frame has no
 * FDE for it), called from C built without frame pointers. Walks by rules stop in it; the
 * stack scan finds the return address it pushed below two saved registers. */

__asm__(".text\n"
        ".globl spin_asm_kernel\n"
        ".type spin_asm_kernel, @function\n"
        "spin_asm_kernel:\n"
        "  push %rbx\n"
        "  push %r12\n"
        "  mov %rdi, %rbx\n"
        "  xor %r12, %r12\n"
        "1:\n"
        "  add %rbx, %r12\n"
        "  dec %rbx\n"
        "  jnz 1b\n"
        "  mov %r12, %rax\n"
        "  pop %r12\n"
        "  pop %rbx\n"
        "  ret\n"
        ".size spin_asm_kernel, .-spin_asm_kernel\n");

unsigned long spin_asm_kernel(unsigned long n);

/* Called by the program's thread; not inlined, so it is a frame of its own. */
__attribute__((noinline)) unsigned long asm_lib_gemm(unsigned long n) {
    unsigned long s = spin_asm_kernel(n);
    __asm__ volatile("" ::: "memory");
    return s + 1;
}
