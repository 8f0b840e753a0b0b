/* cpu_features.h: the CPUID bits the kernels ask for that not every
 * compiler's __builtin_cpu_supports knows by name (clang 14 knows neither
 * AVX-VNNI nor AVX512_BF16). The OS's saving of the wider register state is
 * what the caller's "avx2" or "avx512f" check already asks. */
#ifndef TANDEM_CPU_FEATURES_H
#define TANDEM_CPU_FEATURES_H

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>

enum {
    CPU_LEAF7_1_EAX_AVXVNNI = 4,
    CPU_LEAF7_1_EAX_AVX512BF16 = 5,
};

/* Bit `bit` of EAX of CPUID leaf 7, sub-leaf 1; 0 where the leaf is absent. */
static inline int cpu_leaf7_1_eax_has(int bit)
{
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d))
        return 0;
    return (int)((a >> bit) & 1u);
}
#endif

#endif
