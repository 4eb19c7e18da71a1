//===- TensorParallelKernels.cu - the vocabulary-parallel cross-entropy ----===//
//
// A part of the kernel image (after ModelKernels.cu, whose helpers it uses):
// Megatron's vocabulary-parallel cross-entropy. Each tensor-parallel rank
// holds the logits of its vocabulary share for every row; the group's
// all-reduces between these kernels (max, then sums) give every rank the
// whole row's maximum, sum of exponentials and label logit, so every rank
// computes the same log-sum-exp and loss. Each reduction inside a kernel
// runs in a fixed order (blockMax / blockSum, rows in order), so results are
// deterministic.
//
//===----------------------------------------------------------------------===//

/// One block per row: the row's maximum over this rank's share.
extern "C" __global__ void mhcc_share_row_max(const act_t *logits, float *maxima, int64_t rows, int64_t V) {
  kernelPrologue();
  const act_t *row = logits + blockIdx.x * V;
  float m = -INFINITY;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
    m = fmaxf(m, load(row[v]));
  m = blockMax(m);
  if (threadIdx.x == 0)
    maxima[blockIdx.x] = m;
}

/// One block per row, after the group's maximum: the share's sum of
/// exp(logit - max) and the label's logit where the label lies in the share
/// [first, first + V) (else +0, so the group's sum is the logit exactly).
extern "C" __global__ void mhcc_share_row_sum_exp(const act_t *logits, const float *maxima, const int32_t *labels,
                                                  float *sums, float *targets, int64_t rows, int64_t V,
                                                  int64_t shift, int64_t seq, int64_t first, const int32_t *rowMap) {
  kernelPrologue();
  const int64_t t = blockIdx.x;
  const act_t *row = logits + t * V;
  const float m = maxima[t];
  float sum = 0;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
    sum += expf(load(row[v]) - m);
  sum = blockSum(sum);
  if (threadIdx.x != 0)
    return;
  sums[t] = sum;
  float target = 0.0f;
  if (const int64_t g = microbatchRow(rowMap, t); (g % seq) + shift < seq) {
    const int64_t label = int64_t(labels[g + shift]) - first;
    if (label >= 0 && label < V)
      target = load(row[label]);
  }
  targets[t] = target;
}

/// One block, after the group's sums: each row's log-sum-exp into aux and
/// the mean over labelled rows of lse - label logit, added in row order
/// (rowMap, microbatchRows: a context rank's share of the mean, as mhcc_loss).
extern "C" __global__ void mhcc_share_loss(const float *maxima, const float *sums, const float *targets, float *aux,
                                           float *loss, int64_t rows, int64_t shift, int64_t seq,
                                           const int32_t *rowMap, int64_t microbatchRows) {
  kernelPrologue();
  if (blockIdx.x != 0)
    return;
  for (int64_t t = threadIdx.x; t < rows; t += blockDim.x)
    aux[t] = maxima[t] + logf(sums[t]);
  __syncthreads();
  if (threadIdx.x != 0)
    return;
  float total = 0;
  int64_t counted = 0;
  for (int64_t t = 0; t < rows; ++t)
    if ((microbatchRow(rowMap, t) % seq) + shift < seq) {
      total += aux[t] - targets[t];
      ++counted;
    }
  if (rowMap)
    counted = microbatchCounted(microbatchRows, shift, seq);
  *loss = counted ? total / float(counted) : 0.0f;
}
