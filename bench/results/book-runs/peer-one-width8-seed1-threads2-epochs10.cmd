/usr/bin/python3 /work/main/bench/book_peer.py --width 8 --batch-size 256 --lr 0.1 --epochs 10 --seed 1 --threads 2 --data-dir /usr/share/datasets/fashion-mnist
