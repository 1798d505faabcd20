// Pipeline mistakes are reported before any input is read.
// RUN: not tracea-opt %s --pass-pipeline='builtin.module(tracea-lower-to-linalg{strategy=fastest})' 2>&1 | FileCheck %s --check-prefix=CHOICE
// CHOICE: tracea-opt: error: option 'strategy' of pass 'tracea-lower-to-linalg' must be one of reference; got 'fastest'
// RUN: not tracea-opt %s --pass-pipeline='builtin.module(tracea-lower-to-linalg{speed=1})' 2>&1 | FileCheck %s --check-prefix=OPTION
// OPTION: tracea-opt: error: pass 'tracea-lower-to-linalg' has no option 'speed'; its options: strategy
// RUN: not tracea-opt %s --pass-pipeline='builtin.module(no-such-pass)' 2>&1 | FileCheck %s --check-prefix=UNKNOWN
// UNKNOWN: 'no-such-pass' does not refer to a registered pass or pass pipeline
// RUN: not tracea-opt %s --pass-pipeline='builtin.module(func.func(tracea-verify))' 2>&1 | FileCheck %s --check-prefix=NESTED
// NESTED: Tracea passes run on the whole module; move them out of the nested pipeline 'func.func(tracea-verify)'
// RUN: not tracea-opt %t.does-not-exist 2>&1 | FileCheck %s --check-prefix=MISSING
// MISSING: tracea-opt: error: cannot read {{.*}}does-not-exist: No such file or directory
func.func @f() {
  return
}
