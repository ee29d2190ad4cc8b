# Call CP2 (inline, same warm machine, 0dc2378): the suites whose set-ups session 51 changed
# (1a38fac: RingAttnXnode, MoeVnodes) and the MoE fused/problem suites. A first try (CP) gave
# the tests 30 s by mistake (gc_tests' CAP) and was cut after 20 tests, all passed.
cd .snap && source scripts/gpu_call.sh && gc_init CP2 && gc_tests /tmp/bn '*RingAttnXnode*:*MoeVnodes*:*MoeFused*:*MoeProblem*' 280 280; gc_tar
