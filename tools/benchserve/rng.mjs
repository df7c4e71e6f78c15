// rng.mjs - a small seeded generator (mulberry32), so that every workload
// and every bootstrap is the same for the same seed on any machine.

// A function returning uniform floats in [0, 1) from a 32-bit seed.
export function makeRng(seed) {
  let a = (Number(seed) >>> 0) ^ 0x9e3779b9;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// An integer in [lo, hi] (both included).
export function randInt(rng, lo, hi) {
  return lo + Math.floor(rng() * (hi - lo + 1));
}
