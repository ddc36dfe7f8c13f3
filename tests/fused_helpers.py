"""The golden program of fused-kernel and layout ops that both fused-op test files use: its
text must print back unchanged, and its results must equal numpy's and its unfused form's."""

GOLDEN = """\
module @fused

func @f(%x: f32[4,8], %w: f32[8], %b: f32[4,1]) -> (f32[4,8], f32[4], f32[4,8], bool[4,8]) {
  %y = map %x, %w, %b, body=tanh(add(mul($0, $1), $2)) : f32[4,8]
  %s = map_reduce %x, %w, body=mul(sub($0, $1), sub($0, $1)), reduce=sum, axes=[1] : f32[4]
  %g = map %x, body=select(gt($0, 0.0), $0, mul($0, 0.01)) : f32[4,8]
  %c = map %x, %w, body=ne(maximum($0, -inf), $1) : bool[4,8]
  return %y, %s, %g, %c
}

func @ints(%i: i32[5], %j: i64[2,5]) -> (i32[5], i64[2], i64[2,5]) {
  %k = map %i, body=div(add($0, -7), 2) : i32[5]
  %m = map_reduce %j, body=abs($0), reduce=max, axes=[1] : i64[2]
  %n = map %j, body=3 : i64[2,5]
  return %k, %m, %n
}

func @consts(%x: f64[3]) -> (f64[3], f64[3]) {
  %p = map %x, body=add(add(mul($0, 1e-05), nan), -0.0) : f64[3]
  %q = map %x, body=select(true, minimum($0, inf), 2.5) : f64[3]
  return %p, %q
}

func @mm(%a: f64[8,4], %b: f64[6,8], %bias: f64[6]) -> (f64[4,6], f64[4,6]) {
  %c = matmul_t %a, %b, ta=1, tb=1 : f64[4,6]
  %h = matmul_epi %a, %b, %bias, ta=1, tb=1, body=relu(add($0, $1)) : f64[4,6]
  return %c, %h
}
"""
