package workload

// The product quantiser of the archive study's vector row
// (archive_vectors.go): k-means codebooks per subspace, one byte a
// subspace, asymmetric distances.

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
)

// dot32 is the dot product of a and b (of the same length).
func dot32(a, b []float32) float32 {
	var s float32
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

// pq is a product quantiser: vectors split into m subspaces of sub
// dimensions, each coded by the nearest of k centroids (one byte).
type pq struct {
	m, k, sub int
	cents     [][]float32 // per subspace: k × sub
}

// trainPQ runs k-means (k-means++ seeding, iters Lloyd rounds) in each
// subspace of vecs.
func trainPQ(vecs [][]float32, m, k, iters int, seed uint64) (*pq, error) {
	if len(vecs) == 0 {
		return nil, errors.New("bench: archive: no vectors")
	}
	dim := len(vecs[0])
	if m < 1 || dim%m != 0 || k < 1 || k > 256 {
		return nil, fmt.Errorf("bench: archive: PQ of %d subspaces, %d centroids on %d dimensions", m, k, dim)
	}
	q := &pq{m: m, k: min(k, len(vecs)), sub: dim / m}
	rng := rand.New(rand.NewPCG(seed, 7))
	pts := make([][]float32, len(vecs))
	assign := make([]int, len(vecs))
	for s := range m {
		for i, v := range vecs {
			pts[i] = v[s*q.sub : (s+1)*q.sub]
		}
		c := kmeansPP(pts, q.k, rng)
		for range iters {
			for i, p := range pts {
				assign[i] = nearest(c, q.sub, p)
			}
			sum := make([]float64, q.k*q.sub)
			cnt := make([]int, q.k)
			for i, p := range pts {
				a := assign[i]
				cnt[a]++
				for d, x := range p {
					sum[a*q.sub+d] += float64(x)
				}
			}
			for a := range q.k {
				if cnt[a] == 0 {
					copy(c[a*q.sub:(a+1)*q.sub], pts[rng.IntN(len(pts))]) // an empty cluster takes a random point
					continue
				}
				for d := range q.sub {
					c[a*q.sub+d] = float32(sum[a*q.sub+d] / float64(cnt[a]))
				}
			}
		}
		q.cents = append(q.cents, c)
	}
	return q, nil
}

// kmeansPP picks k centroids from pts by k-means++ seeding.
func kmeansPP(pts [][]float32, k int, rng *rand.Rand) []float32 {
	sub := len(pts[0])
	c := make([]float32, 0, k*sub)
	c = append(c, pts[rng.IntN(len(pts))]...)
	d2 := make([]float64, len(pts))
	for i := range d2 {
		d2[i] = math.Inf(1)
	}
	for len(c) < k*sub {
		last := c[len(c)-sub:]
		total := 0.0
		for i, p := range pts {
			d2[i] = min(d2[i], sqDist(p, last))
			total += d2[i]
		}
		if total == 0 {
			c = append(c, pts[rng.IntN(len(pts))]...)
			continue
		}
		x := rng.Float64() * total
		pick := len(pts) - 1
		for i, d := range d2 {
			if x -= d; x <= 0 {
				pick = i
				break
			}
		}
		c = append(c, pts[pick]...)
	}
	return c
}

func sqDist(a, b []float32) float64 {
	var s float64
	for i := range a {
		d := float64(a[i] - b[i])
		s += d * d
	}
	return s
}

// nearest returns the index of the centroid of c (each sub floats) nearest p.
func nearest(c []float32, sub int, p []float32) int {
	best, bi := math.Inf(1), 0
	for a := 0; a*sub < len(c); a++ {
		if d := sqDist(p, c[a*sub:(a+1)*sub]); d < best {
			best, bi = d, a
		}
	}
	return bi
}

// encode returns v's code: one centroid index per subspace.
func (q *pq) encode(v []float32) []byte {
	code := make([]byte, q.m)
	for s := range q.m {
		code[s] = byte(nearest(q.cents[s], q.sub, v[s*q.sub:(s+1)*q.sub]))
	}
	return code
}

// decode writes the vector code stands for into out.
func (q *pq) decode(code []byte, out []float32) {
	for s, c := range code {
		copy(out[s*q.sub:(s+1)*q.sub], q.cents[s][int(c)*q.sub:(int(c)+1)*q.sub])
	}
}

// scores returns the dot product of query with each code's vector by
// asymmetric distance computation: one table of query·centroid per
// subspace, then a sum of lookups per code.
func (q *pq) scores(query []float32, codes [][]byte) []float32 {
	table := make([]float32, q.m*q.k)
	for s := range q.m {
		qs := query[s*q.sub : (s+1)*q.sub]
		for a := range q.k {
			table[s*q.k+a] = dot32(qs, q.cents[s][a*q.sub:(a+1)*q.sub])
		}
	}
	out := make([]float32, len(codes))
	for i, c := range codes {
		var sum float32
		for s, x := range c {
			sum += table[s*q.k+int(x)]
		}
		out[i] = sum
	}
	return out
}
